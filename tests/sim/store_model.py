"""The store's simulation: its step kinds (the rules that judge a schedule of them are
``sim.store_rules``).

Step kinds (``KINDS``): each entry makes one step (its public-method call and its
``Effect``: the keys it writes, the namespaces it registers or may unlist) and turns
the step's answer into observations (``Obs``). A new kind is one entry: its
``Effect`` says what it does to keys and listing, and the rules judge it with the
others. ``BASE_KINDS`` are those of ``random`` schedules (their seeds replay as
pinned); ``removal`` schedules draw from every kind.

The stores' clock is the scheduler's tick (``TickClock``); a put's ttl is a number of
ticks with a fraction of its own (``_ttl_ticks``).
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import PutOp

Path = tuple[str, ...]
KeyRef = tuple[Path, str]  # (namespace, key)

# The simulated space: namespaces nested three deep (a prefix of one is another), few keys,
# so that steps meet on keys and namespaces.
NAMESPACES: tuple[Path, ...] = (("u1",), ("u1", "mem"), ("u1", "mem", "deep"), ("u2", "mem"))
KEYS = ("a", "b")
# Value sizes: small (inline in both modes), medium (over DynamoDB's 16 KiB inline
# limit: an object of its own there, inline in the manifest's head), large (over 64 KiB
# packed, incompressible: an object in both modes).
SIZES = {"small": 40, "medium": 24_000, "large": 90_000}

BASE_US = 1_750_000_000_000_000  # the tick clock's epoch (2025), in microseconds
US_PER_TICK = 1000
US_PER_MINUTE = 60_000_000
# A put_ttl's ttl, in ticks: some expire within a schedule (a few dozen calls), one
# hardly ever does; each gets a fraction of a tick of its own (``_ttl_ticks``).
TTL_TICKS = (2, 6, 15, 60)
NEVER = float("inf")


class TickClock:
    """The stores' clock source: the scheduler's tick (``ticks()``), in milliseconds from
    ``BASE_US`` (``ttl.Clock`` keeps it strictly increasing within a store)."""

    def __init__(self) -> None:
        self.ticks: Callable[[], int] = lambda: 0

    def __call__(self) -> int:
        return BASE_US + self.ticks() * US_PER_TICK


def tick_of(dt: Any) -> int:
    us = int(dt.timestamp() * 1_000_000)
    return (us - BASE_US) // US_PER_TICK


# -- steps ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Effect:
    """What a step does to the model. ``writes``: the keys it sets (a value) or clears
    (None), each once; ``registers``: the namespaces it adds (a put's); ``unlists``:
    prefixes whose namespaces it may take out of the listing (an erase's); ``ttl``:
    the ticks after which the values it writes expire; ``sweeps``: a TTL sweep."""

    writes: dict[KeyRef, Any] = field(default_factory=dict)
    registers: tuple[Path, ...] = ()
    unlists: tuple[Path, ...] = ()
    ttl: float | None = None  # the values' ttl, in ticks (None: they never expire)
    sweeps: bool = False  # a TTL sweep: unlists only a namespace it finds empty


@dataclass(frozen=True)
class Obs:
    """What an answer showed: a key's value (``value`` None: absent) with its item, or a
    listing (``listed``) of the namespaces under ``scope``."""

    key: KeyRef | None = None
    value: Any = None
    item: Any = None
    listed: frozenset[Path] | None = None


@dataclass(frozen=True)
class Made:
    name: str
    invoke: Callable[[Any], Any]  # store -> result (one public method)
    effect: Effect
    # The observations in the operation's answer (the batch's results: one per op), for reads.
    observe: Callable[[list[Any]], list[Obs]] | None = None
    touches: tuple[Path, ...] = ()  # a read's namespaces


@dataclass(frozen=True)
class Space:
    """Where a schedule's steps go: its namespaces and keys (a narrow one makes them meet)."""

    namespaces: tuple[Path, ...] = NAMESPACES
    keys: tuple[str, ...] = KEYS

    def prefixes(self) -> list[Path]:
        return sorted({ns[:i] for ns in self.namespaces for i in range(len(ns) + 1)})


ONE_KEY = Space((("u1", "mem"),), ("a",))
SPACES = {"": Space(), "one": ONE_KEY}  # a scenario's "@one": every step on one key


@dataclass(frozen=True)
class Kind:
    """One step kind: ``make(rng, label, space)`` builds a step; ``weight`` its share of
    random schedules' steps."""

    weight: float
    make: Callable[[random.Random, str, Space], Made]


def value_of(label: str, size: str, rng: random.Random) -> dict[str, Any]:
    """A unique value: its writer's label, and ``SIZES[size]`` bytes that do not compress."""
    pad = base64.b64encode(rng.randbytes(SIZES[size] * 3 // 4)).decode()
    return {"w": label, "size": size, "pad": pad}


def _ns(rng: random.Random, space: Space) -> Path:
    return rng.choice(space.namespaces)


def _key(rng: random.Random, space: Space) -> str:
    return rng.choice(space.keys)


def under(prefix: Path, ns: Path) -> bool:
    return ns[: len(prefix)] == prefix


def _put(size: str | None) -> Callable[[random.Random, str, Space], Made]:
    def make(rng: random.Random, label: str, space: Space) -> Made:
        ns, key = _ns(rng, space), _key(rng, space)
        chosen = size or rng.choices(list(SIZES), [6, 2, 2])[0]
        value = value_of(label, chosen, rng)
        return Made(f"put {'/'.join(ns)}:{key} {chosen}", lambda s: s.put(ns, key, value),
                    Effect({(ns, key): value}, registers=(ns,)))
    return make


def _put_two(rng: random.Random, label: str, space: Space) -> Made:
    """One batch putting into two namespaces (one commit of two groups), or two keys of one."""
    first, second = rng.sample(space.namespaces, 2) if len(space.namespaces) > 1 else space.namespaces * 2
    k1, k2 = (_key(rng, space), _key(rng, space)) if first != second else (space.keys[0], "z")
    v1 = value_of(label + "/1", rng.choice(["small", "large"]), rng)
    v2 = value_of(label + "/2", "small", rng)
    ops = [PutOp(first, k1, v1), PutOp(second, k2, v2)]
    return Made(f"batch put {'/'.join(first)}:{k1} {'/'.join(second)}:{k2}", lambda s: s.batch(ops),
                Effect({(first, k1): v1, (second, k2): v2}, registers=(first, second)))


def _delete(rng: random.Random, label: str, space: Space) -> Made:
    ns, key = _ns(rng, space), _key(rng, space)
    return Made(f"delete {'/'.join(ns)}:{key}", lambda s: s.delete(ns, key), Effect({(ns, key): None}))


def _get(rng: random.Random, label: str, space: Space) -> Made:
    ns, key = _ns(rng, space), _key(rng, space)
    # Reads do not refresh expiries (refresh_ttl=False): a read writes nothing, and an
    # expiry is the put's alone.
    return Made(f"get {'/'.join(ns)}:{key}", lambda s: s.get(ns, key, refresh_ttl=False), Effect(),
                lambda results: [Obs((ns, key), None if results[0] is None else results[0].value, results[0])], (ns,))


def _search(rng: random.Random, label: str, space: Space) -> Made:
    prefix = rng.choice(space.prefixes())

    def observe(results: list[Any]) -> list[Obs]:
        found = {(tuple(i.namespace), i.key): i for i in results[0]}
        return [Obs((ns, k), found[(ns, k)].value if (ns, k) in found else None, found.get((ns, k)))
                for ns in NAMESPACES if under(prefix, ns) for k in (*KEYS, "z")]

    return Made(f"search {'/'.join(prefix) or '()'}", lambda s: s.search(prefix, limit=1000, refresh_ttl=False), Effect(), observe,
                tuple(ns for ns in NAMESPACES if under(prefix, ns)))


def _list(rng: random.Random, label: str, space: Space) -> Made:
    return Made("list_namespaces", lambda s: s.list_namespaces(limit=1000), Effect(),
                lambda results: [Obs(listed=frozenset(tuple(p) for p in results[0]))])


def _ttl_ticks(rng: random.Random) -> float:
    """A ttl in ticks, with a fraction (100-899 microseconds): an expiry never falls on a
    tick, so "expired at tick q" is ``q > expiry`` whatever microseconds a store's clock
    adds to keep itself increasing."""
    return rng.choice(TTL_TICKS) + rng.randrange(100, 900) / US_PER_TICK


def ttl_minutes(ticks: float) -> float:
    """``ticks`` as the minutes ``put(ttl=...)`` takes (exact to the microsecond)."""
    return ticks * US_PER_TICK / US_PER_MINUTE


def _put_ttl(rng: random.Random, label: str, space: Space) -> Made:
    """A put with a ttl of a few ticks: it expires within the schedule, or not."""
    ns, key = _ns(rng, space), _key(rng, space)
    size = rng.choice(["small", "large"])
    value = value_of(label, size, rng)
    ticks = _ttl_ticks(rng)
    minutes = ttl_minutes(ticks)
    return Made(f"put {'/'.join(ns)}:{key} {size} ttl {ticks:g}", lambda s: s.put(ns, key, value, ttl=minutes),
                Effect({(ns, key): value}, registers=(ns,), ttl=ticks))


def _erase(rng: random.Random, label: str, space: Space) -> Made:
    """erase_namespace of a prefix of the space's namespaces (``()``: everything=True)."""
    prefix = rng.choice(space.prefixes())
    gone = {(ns, k): None for ns in NAMESPACES if under(prefix, ns) for k in (*KEYS, "z")}
    return Made(f"erase {'/'.join(prefix) or '() everything'}",
                lambda s: s.erase_namespace(prefix, everything=not prefix), Effect(gone, unlists=(prefix,)))


def _sweep(rng: random.Random, label: str, space: Space) -> Made:
    return Made("sweep_ttl", lambda s: s.sweep_ttl(), Effect(sweeps=True))


# The kinds of ``random`` schedules (unchanged: their pinned seeds replay as they did).
BASE_KINDS: dict[str, Kind] = {
    "put": Kind(4, _put("small")),
    "put_large": Kind(2, _put("large")),
    "put_medium": Kind(1, _put("medium")),
    "put_two": Kind(1, _put_two),
    "delete": Kind(2, _delete),
    "get": Kind(2, _get),
    "search": Kind(2, _search),
    "list": Kind(1, _list),
}
# Removals and expiry: with the base kinds, those of ``removal`` schedules.
REMOVAL_KINDS: dict[str, Kind] = {
    "put_ttl": Kind(3, _put_ttl),
    "erase": Kind(2, _erase),
    "sweep": Kind(2, _sweep),
}
KINDS: dict[str, Kind] = {**BASE_KINDS, **REMOVAL_KINDS}
