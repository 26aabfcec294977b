"""The store's simulation: its step kinds, and the rules that judge a schedule of them.

``S3Store`` has no history a model must replay in order: every item is a register of
its own (a put or a delete replaces it whole), and the namespaces are a set that puts
add to. So the rules are per key, on the real-time windows of the writes (the
scheduler's ticks), rather than a search over orders (``sim.model.linearize``):

* a write *takes effect* at one of its calls (the head's swap, the item's write), so
  in ``(start, last]``: from its first call to the last call it sent (an abandoned
  step sends nothing after its cut; a step cut and retried is one write whose window
  spans its attempts, which may each take effect);
* it *surely* took effect if it answered; it *may* have if it sent any call;
* ``w`` is surely before ``w2`` when ``w.last <= w2.start``.

What the rules ask (``Judge``):

* **final**: each key's final value (or absence) is one a write of it wrote (the
  value of a put, whole: every value is unique, so a torn or mixed one names no put)
  that could have been last: no write that surely took effect is surely after it;
* **reads** (get, search, answered during the schedule): a key read (found or not)
  holds what a write of it that had started wrote, never older than a write that
  answered before the read started (read your completed writes, per key);
* **listing**: a namespace is listed by ``list_namespaces`` (during the schedule, at
  the end) if a put into it answered before the listing started (and nothing that
  unlists it may have come after that put); a listed namespace had a put begun;
  at the end every namespace holding a readable item is listed, and found by a search
  of each of its prefixes with the value ``get`` returns;
* **created_at**: a key no step deletes keeps one ``created_at`` in every read of the
  schedule, set no later than the answer of its first put (the stores' clock is the
  scheduler's tick: ``TickClock``); ``updated_at`` is never before it;
* **leftovers**: once no step was cut (every step answered without a cut; lost
  replies and unsent requests are retried inside the step and count as answered), no
  value object ``memory/n/<id>/@v/<token>`` is left that no row names, and none a row
  names is missing. A step cut short (abandoned, or retried by a fresh process) may
  leave the value object of a commit that never landed: garbage collection's, as for
  the saver's leftover check (``check.deleted_cleanly``).

Step kinds (``KINDS``): each entry makes one step (its public-method call and its
``Effect``: the keys it writes, the namespaces it registers or may unlist) and turns
the step's answer into observations (``Obs``). A new kind (e.g. ``erase`` of a prefix,
``sweep``) is one entry: its ``Effect`` says what it does to keys and listing, and
the rules above judge it with the others.
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
    prefixes whose namespaces it may take out of the listing (an erase's)."""

    writes: dict[KeyRef, Any] = field(default_factory=dict)
    registers: tuple[Path, ...] = ()
    unlists: tuple[Path, ...] = ()


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
    return Made(f"get {'/'.join(ns)}:{key}", lambda s: s.get(ns, key), Effect(),
                lambda results: [Obs((ns, key), None if results[0] is None else results[0].value, results[0])])


def _search(rng: random.Random, label: str, space: Space) -> Made:
    prefix = rng.choice(space.prefixes())

    def observe(results: list[Any]) -> list[Obs]:
        found = {(tuple(i.namespace), i.key): i for i in results[0]}
        return [Obs((ns, k), found[(ns, k)].value if (ns, k) in found else None, found.get((ns, k)))
                for ns in NAMESPACES if under(prefix, ns) for k in (*KEYS, "z")]

    return Made(f"search {'/'.join(prefix) or '()'}", lambda s: s.search(prefix, limit=1000), Effect(), observe)


def _list(rng: random.Random, label: str, space: Space) -> Made:
    return Made("list_namespaces", lambda s: s.list_namespaces(limit=1000), Effect(),
                lambda results: [Obs(listed=frozenset(tuple(p) for p in results[0]))])


KINDS: dict[str, Kind] = {
    "put": Kind(4, _put("small")),
    "put_large": Kind(2, _put("large")),
    "put_medium": Kind(1, _put("medium")),
    "put_two": Kind(1, _put_two),
    "delete": Kind(2, _delete),
    "get": Kind(2, _get),
    "search": Kind(2, _search),
    "list": Kind(1, _list),
}


# -- the rules -----------------------------------------------------------------------------
@dataclass
class Write:
    """One write of one key: a step's (or the setup's), with its window in ticks."""

    label: str
    value: Any  # None: the key cleared
    start: int
    last: int | None  # its last call sent (None: it sent none: it never took effect)
    end: int | None  # its answer (None: abandoned)
    ok: bool  # answered: it surely took effect

    @property
    def may(self) -> bool:
        return self.last is not None

    def before(self, other: Write) -> bool:
        """Surely before ``other`` (if both take effect)."""
        return self.last is not None and self.last <= other.start


@dataclass
class Read:
    label: str
    start: int
    end: int
    obs: list[Obs]


@dataclass
class History:
    """The schedule as the rules see it."""

    writes: dict[KeyRef, list[Write]] = field(default_factory=dict)
    registers: dict[Path, list[Write]] = field(default_factory=dict)  # value unused
    unlisters: list[tuple[Path, Write]] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    cut: bool = False  # some step was cut (abandoned or retried by a fresh process)

    def add(self, label: str, effect: Effect, start: int, last: int | None, end: int | None, ok: bool) -> None:
        for key, value in effect.writes.items():
            self.writes.setdefault(key, []).append(Write(label, value, start, last, end, ok))
        for ns in effect.registers:
            self.registers.setdefault(ns, []).append(Write(label, True, start, last, end, ok))
        for prefix in effect.unlists:
            self.unlisters.append((prefix, Write(label, None, start, last, end, ok)))


def _same(a: Any, b: Any) -> bool:
    return a == b


def _name(value: Any) -> str:
    if value is None:
        return "absent"
    if isinstance(value, dict) and "w" in value:
        return f"{value['w']}'s {value.get('size')} value"
    return f"an unknown value {str(value)[:80]}"


class Judge:
    """Every rule of the module docstring, over one ``History``."""

    def __init__(self, history: History) -> None:
        self.h = history

    def _writers(self, key: KeyRef, value: Any) -> list[Write]:
        """The writes of ``key`` that wrote ``value`` (absence: the deletes, and the
        initial state when no setup wrote the key)."""
        writes = self.h.writes.get(key, [])
        found = [w for w in writes if w.may and _same(w.value, value)]
        if value is None and not any(w.label == "setup" for w in writes):
            found.append(Write("initial", None, -3, -2, -2, True))
        return found

    def final(self, key: KeyRef, value: Any) -> str | None:
        """The problem with ``value`` as the key's final state, or None."""
        writes = self.h.writes.get(key, [])
        candidates = self._writers(key, value)
        if not candidates:
            return f"{_show(key)} ends {_name(value)}, which no write of it wrote (writes: {_writes(writes)})"
        for w in candidates:
            later = [o for o in writes if o is not w and o.ok and w.before(o)]
            if not later:
                return None
        return (f"{_show(key)} ends {_name(value)} ({', '.join(w.label for w in candidates)}), but a write that "
                f"answered came surely after it (writes: {_writes(writes)})")

    def read(self, r: Read, key: KeyRef, value: Any) -> str | None:
        writes = self.h.writes.get(key, [])
        candidates = [w for w in self._writers(key, value) if w.start < r.end]
        if not candidates:
            return f"{r.label} ({r.start}..{r.end}) read {_show(key)} as {_name(value)}: no write of it that had begun wrote that (writes: {_writes(writes)})"
        for w in candidates:
            newer = [o for o in writes if o is not w and o.ok and o.end is not None and o.end <= r.start and w.before(o)]
            if not newer:
                return None
        return (f"{r.label} ({r.start}..{r.end}) read {_show(key)} as {_name(value)}, older than a write that answered "
                f"before the read began (writes: {_writes(writes)})")

    def must_list(self, ns: Path, start: int) -> bool:
        """Whether a listing begun at ``start`` must name ``ns``."""
        for p in self.h.registers.get(ns, []):
            if p.ok and p.end is not None and p.end <= start:
                if not any(under(prefix, ns) and not u.before(p) for prefix, u in self.h.unlisters if u.may):
                    return True
        return False

    def may_list(self, ns: Path, end: int) -> bool:
        """Whether a listing answered at ``end`` may name ``ns``: a put into it had begun,
        and no unlisting that answered before surely came after every such put."""
        puts = [p for p in self.h.registers.get(ns, []) if p.may and p.start < end]
        gone = [u for prefix, u in self.h.unlisters if under(prefix, ns) and u.ok and u.end is not None and u.end <= end]
        return any(not any(p.before(u) for u in gone) for p in puts)

    def listing(self, label: str, start: int, end: int, listed: frozenset[Path]) -> list[str]:
        problems = []
        known = set(self.h.registers) | set(listed)
        for ns in sorted(known):
            if ns in listed and not self.may_list(ns, end):
                problems.append(f"{label} ({start}..{end}) listed {_show_ns(ns)}, into which no put had begun")
            if ns not in listed and self.must_list(ns, start):
                problems.append(f"{label} ({start}..{end}) did not list {_show_ns(ns)}, which a put that answered before it registered")
        return problems

    def during(self) -> list[str]:
        """The reads answered during the schedule."""
        problems = []
        for r in self.h.reads:
            for o in r.obs:
                if o.listed is not None:
                    problems += self.listing(r.label, r.start, r.end, o.listed)
                elif o.key is not None:
                    problem = self.read(r, o.key, o.value)
                    if problem:
                        problems.append(problem)
        return problems

    def created(self, finals: dict[KeyRef, Any]) -> list[str]:
        """``created_at`` of the keys no step deletes: one in every read, set no later than
        the first answered put's answer; ``updated_at`` never before it."""
        problems = []
        seen: dict[KeyRef, list[tuple[str, Any]]] = {}
        for r in self.h.reads:
            for o in r.obs:
                if o.key is not None and o.item is not None:
                    seen.setdefault(o.key, []).append((r.label, o.item))
        for key, item in finals.items():
            if item is not None:
                seen.setdefault(key, []).append(("the final read", item))
        for key, items in seen.items():
            for label, item in items:
                if item.updated_at < item.created_at:
                    problems.append(f"{label}: {_show(key)} updated_at {item.updated_at} before created_at {item.created_at}")
            writes = self.h.writes.get(key, [])
            if any(w.value is None for w in writes):
                continue  # a delete starts a new item (a new created_at)
            created = {item.created_at for _, item in items}
            if len(created) > 1:
                problems.append(f"{_show(key)} (never deleted) was read with created_at "
                                f"{sorted(f'{tick_of(c)}' for c in created)} (ticks): an overwrite moved it")
            answered = [w.end for w in writes if w.ok and w.end is not None]
            if answered:
                first = min(answered)
                late = [tick_of(c) for c in created if tick_of(c) > first]
                if late:
                    problems.append(f"{_show(key)} created_at at tick {late[0]}, after its first put answered (tick {first})")
        return problems


def _show(key: KeyRef) -> str:
    return f"{'/'.join(key[0])}:{key[1]}"


def _show_ns(ns: Path) -> str:
    return "/".join(ns) or "()"


def _writes(writes: list[Write]) -> str:
    def one(w: Write) -> str:
        state = "ok" if w.ok else ("abandoned" if w.end is None else "raised")
        return f"{w.label}={_name(w.value)} {w.start}..{w.last if w.last is not None else '-'} {state}"
    return "; ".join(one(w) for w in writes) or "none"
