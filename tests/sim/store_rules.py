"""The rules that judge a schedule of the store's steps (``sim.store_model``'s kinds).

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

Removals (``erase``, ``sweep``) and expiry (``put_ttl``):

* an **erase** of a prefix is, per key under it, a write of absence (one point in its
  window: the namespace's rows removed), and it may unlist every namespace under it:
  a put surely before it is erased and unlisted, one racing it either erased or whole
  and listed (the listing rules above, and "a readable item's namespace is listed");
* a put with a **ttl** (in ticks, with a fraction so no two expiries meet on a tick)
  writes its value and, ``ttl`` after the store's clock read in its commit, its
  absence: a read (or the end) may find it absent once that time may have passed, and
  must not find the value once it surely has. The clock a step reads lies between the
  tick its method was called (``Write.clock``: the operation is built then, before
  its first call) and its last call;
* a **sweep** writes no key (it removes only what no read returns) and unlists a
  namespace only when it may have found it empty; one that answered after a namespace
  was surely empty at its clock (every put of it surely before the sweep, each key
  surely deleted or expired) unlisted it: no listing after it names the namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.store_model import NEVER, Effect, KeyRef, Obs, Path, tick_of, under


@dataclass
class Write:
    """One write of one key: a step's (or the setup's), with its window in ticks."""

    label: str
    value: Any  # None: the key cleared
    start: int
    last: int | None  # its last call sent (None: it sent none: it never took effect)
    end: int | None  # its answer (None: abandoned)
    ok: bool  # answered: it surely took effect
    ttl: float | None = None  # its value expires ttl ticks after the clock its commit read
    clock: int | None = None  # the tick its method was first called (None: ``start``)

    @property
    def may(self) -> bool:
        return self.last is not None

    @property
    def since(self) -> int:
        """The earliest tick its clock may read (its operation is built, and may read the
        clock, when its method is called: before its first call)."""
        return self.start if self.clock is None else min(self.clock, self.start)

    def before(self, other: Write) -> bool:
        """Surely before ``other`` (if both take effect)."""
        return self.last is not None and self.last <= other.start


@dataclass
class Read:
    label: str
    start: int
    end: int
    obs: list[Obs]
    clock: int | None = None  # as ``Write.clock``: its clock reads lie in [since, end]

    @property
    def since(self) -> int:
        return self.start if self.clock is None else min(self.clock, self.start)


@dataclass
class History:
    """The schedule as the rules see it."""

    writes: dict[KeyRef, list[Write]] = field(default_factory=dict)
    registers: dict[Path, list[Write]] = field(default_factory=dict)  # value unused
    unlisters: list[tuple[Path, Write]] = field(default_factory=list)
    sweeps: list[Write] = field(default_factory=list)  # value unused
    # Namespaces an erase kept registered (its report's ``written_during``): a put came
    # back, or the erase left a version in the folder (then, in DynamoDB mode, under the
    # erase's mark, which no sweep takes).
    held: dict[Path, list[Write]] = field(default_factory=dict)
    reads: list[Read] = field(default_factory=list)
    cut: bool = False  # some step was cut (abandoned or retried by a fresh process)

    def add(self, label: str, effect: Effect, start: int, last: int | None, end: int | None, ok: bool,
            clock: int | None = None) -> None:
        for key, value in effect.writes.items():
            ttl = effect.ttl if value is not None else None
            self.writes.setdefault(key, []).append(Write(label, value, start, last, end, ok, ttl, clock))
        for ns in effect.registers:
            self.registers.setdefault(ns, []).append(Write(label, True, start, last, end, ok, None, clock))
        for prefix in effect.unlists:
            self.unlisters.append((prefix, Write(label, None, start, last, end, ok, None, clock)))
        if effect.sweeps:
            self.sweeps.append(Write(label, None, start, last, end, ok, None, clock))


def _same(a: Any, b: Any) -> bool:
    return a == b


def _name(value: Any) -> str:
    if value is None:
        return "absent"
    if isinstance(value, dict) and "w" in value:
        return f"{value['w']}'s {value.get('size')} value"
    return f"an unknown value {str(value)[:80]}"


# An explanation of what a key holds: a write that may have taken effect, and whether
# it is that write's value (False) or its expiry (True: absent, the value's ttl passed).
Explanation = tuple[Write, bool]
INITIAL = Write("initial", None, -3, -2, -2, True)


class Judge:
    """Every rule of the module docstring, over one ``History``."""

    def __init__(self, history: History) -> None:
        self.h = history

    def _explanations(self, key: KeyRef, value: Any) -> list[Explanation]:
        """What may have left ``key`` holding ``value``: the writes of it (absence: the
        deletes and erases, the expiry of any put with a ttl, and the initial state when no
        setup wrote the key)."""
        writes = self.h.writes.get(key, [])
        found = [(w, False) for w in writes if w.may and _same(w.value, value)]
        if value is None:
            found += [(w, True) for w in writes if w.may and w.value is not None and w.ttl is not None]
            if not any(w.label == "setup" for w in writes):
                found.append((INITIAL, False))
        return found

    @staticmethod
    def expiry(w: Write) -> tuple[float, float]:
        """The earliest and the latest tick ``w``'s value may expire (never: no ttl).
        Its commit reads the clock between its method's call and its last call."""
        if w.ttl is None or w.value is None or w.last is None:
            return NEVER, NEVER
        return w.since + w.ttl, w.last + w.ttl

    def _in_time(self, e: Explanation, q0: float, q1: float) -> bool:
        """Whether ``e`` fits a clock read in [q0, q1]: a value not surely expired by q0;
        an expiry that may have passed by q1 (expired at q: q past the expiry)."""
        w, expired = e
        early, late = self.expiry(w)
        return q1 > early if expired else q0 < late

    def final(self, key: KeyRef, value: Any, now: int) -> str | None:
        """The problem with ``value`` as the key's final state (read at tick ``now``), or None."""
        writes = self.h.writes.get(key, [])
        found = self._explanations(key, value)
        candidates = [e for e in found if self._in_time(e, now, now)]
        if not candidates:
            why = "no write of it wrote" if not found else f"at tick {now} {_timing(found)}"
            return f"{_show(key)} ends {_name(value)}, which {why} (writes: {_writes(writes)})"
        for w, _ in candidates:
            later = [o for o in writes if o is not w and o.ok and w.before(o)]
            if not later:
                return None
        return (f"{_show(key)} ends {_name(value)} ({', '.join(_label(e) for e in candidates)}), but a write that "
                f"answered came surely after it (writes: {_writes(writes)})")

    def read(self, r: Read, key: KeyRef, value: Any) -> str | None:
        writes = self.h.writes.get(key, [])
        found = [e for e in self._explanations(key, value) if e[0].start < r.end]
        candidates = [e for e in found if self._in_time(e, r.since, r.end)]
        if not candidates:
            why = "no write of it that had begun wrote that" if not found else f"with a clock in {r.since}..{r.end} {_timing(found)}"
            return f"{r.label} ({r.start}..{r.end}) read {_show(key)} as {_name(value)}: {why} (writes: {_writes(writes)})"
        for w, _ in candidates:
            newer = [o for o in writes if o is not w and o.ok and o.end is not None and o.end <= r.start and w.before(o)]
            if not newer:
                return None
        return (f"{r.label} ({r.start}..{r.end}) read {_show(key)} as {_name(value)}, older than a write that answered "
                f"before the read began (writes: {_writes(writes)})")

    def _keys(self, ns: Path) -> list[KeyRef]:
        return [key for key in self.h.writes if key[0] == ns]

    def _may_empty(self, ns: Path, s: Write) -> bool:
        """Whether sweep ``s`` may have found ``ns`` empty: each key of it may have been
        absent (deleted, erased, expired at a clock the sweep read) while it ran."""
        assert s.last is not None
        for key in self._keys(ns):
            writes = self.h.writes[key]
            if not any(
                w.start < s.last
                and self._in_time((w, expired), s.since, s.last)
                and not any(o is not w and o.ok and o.end is not None and o.end <= s.start and w.before(o) for o in writes)
                for w, expired in self._explanations(key, None)
            ):
                return False
        return True

    def _surely_absent(self, key: KeyRef, s: Write) -> bool:
        """Whether ``key`` surely held no live item when sweep ``s`` read it: every put of
        it surely done before the sweep began, and each superseded by a write that answered
        before then, or expired at the sweep's earliest clock."""
        writes = self.h.writes.get(key, [])
        for w in writes:
            if not w.may or w.value is None:
                continue
            assert w.last is not None
            if w.last > s.start:
                return False
            if any(o is not w and o.ok and o.end is not None and o.end <= s.start and w.before(o) for o in writes):
                continue
            if s.since < self.expiry(w)[1]:
                return False
        return True

    def swept_away(self, ns: Path, start: int) -> Write | None:
        """A sweep that answered before ``start`` and surely found ``ns`` empty, so
        unlisted it: no put into it may have come after the sweep began, and no erase of it
        was still running, cut short, or kept it registered (a removal under way, or one
        that left a version in its folder, holds the namespace)."""
        puts = [p for p in self.h.registers.get(ns, []) if p.may]
        erases = [u for prefix, u in self.h.unlisters if under(prefix, ns) and u.may]
        for s in self.h.sweeps:
            if not s.ok or s.end is None or s.end > start:
                continue
            if any(p.last is not None and p.last > s.start for p in puts):
                continue
            if any(not (u.ok and u.end is not None and u.end <= s.start) for u in erases):
                continue
            if any(u.start < s.end for u in self.h.held.get(ns, [])):
                continue
            if all(self._surely_absent(key, s) for key in self._keys(ns)):
                return s
        return None

    def must_list(self, ns: Path, start: int) -> bool:
        """Whether a listing begun at ``start`` must name ``ns``."""
        for p in self.h.registers.get(ns, []):
            if p.ok and p.end is not None and p.end <= start:
                if any(under(prefix, ns) and not u.before(p) for prefix, u in self.h.unlisters if u.may):
                    continue
                if any(not s.before(p) and self._may_empty(ns, s) for s in self.h.sweeps if s.may):
                    continue
                return True
        return False

    def may_list(self, ns: Path, end: int) -> bool:
        """Whether a listing answered at ``end`` may name ``ns``: a put into it had begun,
        and no unlisting that answered before surely came after every such put."""
        puts = [p for p in self.h.registers.get(ns, []) if p.may and p.start < end]
        gone = [u for prefix, u in self.h.unlisters if under(prefix, ns) and u.ok and u.end is not None and u.end <= end]
        if any(u.start < end for u in self.h.held.get(ns, [])):
            # An erase's report named it in ``written_during``: it stays registered, as
            # documented (a version left in its folder, a young object of a migration's
            # rewrite among them: the erase called again finds it).
            return True
        return any(not any(p.before(u) for u in gone) for p in puts)

    def listing(self, label: str, start: int, end: int, listed: frozenset[Path]) -> list[str]:
        problems = []
        known = set(self.h.registers) | set(listed)
        for ns in sorted(known):
            if ns in listed and not self.may_list(ns, end):
                problems.append(f"{label} ({start}..{end}) listed {_show_ns(ns)}, into which no put had begun")
            if ns not in listed and self.must_list(ns, start):
                problems.append(f"{label} ({start}..{end}) did not list {_show_ns(ns)}, which a put that answered before it registered")
            swept = self.swept_away(ns, start) if ns in listed else None
            if swept is not None:
                problems.append(f"{label} ({start}..{end}) listed {_show_ns(ns)}, which {swept.label} ({swept.start}..{swept.end}) "
                                "surely found empty (every put into it done before, each key deleted or expired): it must "
                                "have unlisted it")
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
            if any(w.value is None or w.ttl is not None for w in writes):
                continue  # a delete, an erase or an expiry starts a new item (a new created_at)
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


def _label(e: Explanation) -> str:
    return f"{e[0].label}'s expiry" if e[1] else e[0].label


def _timing(found: list[Explanation]) -> str:
    """Why none of ``found`` fits the clock: each value's expiry window."""
    parts = []
    for w, expired in found:
        early, late = Judge.expiry(w)
        parts.append(f"{_label((w, expired))} {'expires' if w.ttl is not None else 'never expires'}"
                     + (f" in {early:g}..{late:g}" if w.ttl is not None else ""))
    return "the value was surely expired or could not have expired yet: " + "; ".join(parts)


def _show(key: KeyRef) -> str:
    return f"{'/'.join(key[0])}:{key[1]}"


def _show_ns(ns: Path) -> str:
    return "/".join(ns) or "()"


def _writes(writes: list[Write]) -> str:
    def one(w: Write) -> str:
        state = "ok" if w.ok else ("abandoned" if w.end is None else "raised")
        ttl = f" ttl {w.ttl:g} (clock from {w.since})" if w.ttl is not None else ""
        return f"{w.label}={_name(w.value)} {w.start}..{w.last if w.last is not None else '-'} {state}{ttl}"
    return "; ".join(one(w) for w in writes) or "none"
