"""The store's encrypted worlds: ``S3Store(encryption=...)`` in the schedules, and what is
checked beyond the plaintext store's rules (issue 44, crypto-erasure).

A ``StoreWorld(..., encryption="local" | "kms")`` gives every store it builds the world's
master key (``sim.world._encryption``: one deployment's processes). Two kinds of schedule:

* **the commit key fence** (any scenario in an encrypted world: ``put_large+erase@one``,
  ``get,put_large+erase@one``, ``removal``...): a put or a batch sealed under a
  namespace's key races ``erase_namespace``, which destroys the key first, then deletes. A
  write sealed under a key an erase destroyed is refused where it commits (``KeyFenced``)
  and sealed again under the new key (``sealing.rekeying``); while the erase runs, a write
  into one of its namespaces, and a read of its content, may raise ``NamespaceErasedError``
  with no effect (``erase_refused``);
* **the migration** (a scenario with ``encrypt``: ``S3Store.encrypt_namespaces()``): the
  setup is written by a store without encryption, and ``plain_*`` steps run on old
  processes without it (``old_process``: a process whose every step is ``plain_*``).
  Meanwhile an encrypting read may be refused plaintext (``PlaintextObjectError``) and an
  old process's read encrypted content (``EncryptedObjectError``), with no effect
  (``migration_refused``). After the schedule (abandoned erases called again), a fresh
  process runs ``encrypt_namespaces()`` with the grace period over: every namespace must
  end complete, and a run after it must encrypt nothing (``finish_migration``).

After the final reads (``store_runner._verify``: each key holds what the rules allow, and
every item is read: an item indexed under a destroyed key fails them with
``NamespaceErasedError``; a put that answered after the erase finished is the key's final
value unless a later write replaced it), for every encrypted world:

* ``plaintext_left``: no version of any object under the schedule's prefix (bucket and key
  store) and no attribute of any index item of the prefix holds any written value's
  bytes, decoded as deep as they go (``test_encryption._layers``).
"""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

from sim import store_model as SM

PLAIN = "plain_"  # a step kind of an old process (a store without encryption)
MIGRATE = "encrypt"


def _plain_put(size: str) -> Any:
    make = SM._put(size)

    def plain(rng: Any, label: str, space: SM.Space) -> SM.Made:
        made = make(rng, label, space)
        return SM.Made("plain " + made.name, made.invoke, made.effect)

    return plain


def _plain_get(rng: Any, label: str, space: SM.Space) -> SM.Made:
    made = SM._get(rng, label, space)
    return SM.Made("plain " + made.name, made.invoke, made.effect, made.observe, made.touches)


def _encrypt(rng: Any, label: str, space: SM.Space) -> SM.Made:
    """encrypt_namespaces() of every namespace: to readers, nothing changes (its statuses
    are emitted; the final migration after the schedule judges the end state)."""
    return SM.Made("encrypt_namespaces", lambda s: s.encrypt_namespaces(), SM.Effect(), touches=SM.NAMESPACES)


# The kinds of the migration's schedules (spelled, or drawn by ``migration``).
KINDS: dict[str, SM.Kind] = {
    "plain_put": SM.Kind(3, _plain_put("small")),
    "plain_put_large": SM.Kind(2, _plain_put("large")),
    "plain_get": SM.Kind(1, _plain_get),
    MIGRATE: SM.Kind(0, _encrypt),
}
# A ``migration`` schedule: process 0 migrates; the others are drawn from these (an old
# process: only plain kinds; a new one: the others).
OLD_KINDS = {"plain_put": 3, "plain_put_large": 2, "plain_get": 1}
NEW_KINDS = {"put": 2, "put_large": 2, "delete": 1, "get": 2, "search": 1, "erase": 1}


def migration(kinds: list[list[str]]) -> bool:
    return any(kind == MIGRATE or kind.startswith(PLAIN) for steps in kinds for kind in steps)


def old_process(kinds: list[str]) -> bool:
    return bool(kinds) and all(kind.startswith(PLAIN) for kind in kinds)


def draw_migration(rng: Any) -> list[list[str]]:
    """Process 0 migrates (once, or cut short and run again by itself: twice); one or two
    others, each an old process or a new one."""
    plan = [[MIGRATE] * rng.choice((1, 1, 2))]
    for _ in range(rng.randint(1, 2)):
        drawn = OLD_KINDS if rng.random() < 0.5 else NEW_KINDS
        plan.append(rng.choices(list(drawn), list(drawn.values()), k=rng.randint(1, 3)))
    return plan


# -- what the schedule may answer ---------------------------------------------------------------
def touched(made: SM.Made) -> tuple[SM.Path, ...]:
    return (*made.touches, *(ns for ns, _ in made.effect.writes), *made.effect.registers)


def erase_refused(op: Any, made: SM.Made, error: BaseException, erases: list[Any]) -> Any:
    """The erase during which (or after whose cut) ``op`` could be refused its namespace's
    key (``NamespaceErasedError``: destroyed, the erase not settled), or None."""
    from s3_saver import NamespaceErasedError

    if not isinstance(error, NamespaceErasedError) or op.start is None or op.end is None:
        return None
    for e in erases:
        w = e.write
        overlaps = w.may and w.start < op.end and (w.end is None or op.start < w.end)
        if overlaps and any(SM.under(e.prefix, ns) for ns in touched(made)):
            return e
    return None


def migration_refused(error: BaseException, made: SM.Made) -> bool:
    """A migration's world: a read refused content of the other kind, by name, with no
    effect (an encrypting one plaintext not migrated yet; an old one encrypted content);
    or the migration failed by a transient fault on a rewrite: in DynamoDB mode a rewrite
    is never sent again blindly (``_index/dynamodb/memory_reseal``: a lost answer fails
    the call, and the migration run again judges the item), a cut the final migration
    finishes."""
    from s3_saver import EncryptedObjectError, PlaintextObjectError
    from s3_saver.errors import StoreUnavailableError

    if made.name == "encrypt_namespaces":
        return isinstance(error, StoreUnavailableError)
    return made.observe is not None and isinstance(error, (PlaintextObjectError, EncryptedObjectError))


# -- after the schedule -------------------------------------------------------------------------
def finish_migration(world: Any, prefix: str, problems: list[str]) -> list[str]:
    """Every namespace migrated again by a fresh process, as an operator finishes a rollout
    once no old process runs (the grace period over, nothing in flight): each must end
    complete, and a run after it must encrypt nothing. What it did, in words."""
    done = []
    with mock.patch("s3_saver._ops.memory.encrypt.GRACE", 0.0):
        for attempt in ("the final migration", "a migration after the final one"):
            try:
                statuses = list(world.saver(prefix).encrypt_namespaces())
            except Exception as exc:  # noqa: BLE001 (any error is the schedule's problem, reported)
                problems.append(f"{attempt}: encrypt_namespaces raised {type(exc).__name__}: {str(exc)[:300]}")
                return done
            bad = [s for s in statuses if not s.complete or (attempt != "the final migration" and s.items)]
            if bad:
                problems.append(f"{attempt}: {bad[:3]}")
                return done
            done.append(f"(harness) {attempt}: {len(statuses)} namespaces, {sum(s.items for s in statuses)} items encrypted")
    return done


def needles(history: Any) -> set[bytes]:
    """Each written value's random bytes (base64, 40 characters or more: no chance match)."""
    return {
        w.value["pad"].encode()
        for writes in history.writes.values()
        for w in writes
        if isinstance(w.value, dict) and isinstance(w.value.get("pad"), str) and len(w.value["pad"]) >= 20
    }


def plaintext_left(world: Any, prefix: str, history: Any) -> list[str]:
    """No stored place holds a written value in plaintext (see the module docstring)."""
    from sim.crypto import _holds, stored

    wanted = needles(history)
    if not wanted:
        return []
    leaks = [where for where, blob in stored(world, prefix) if _holds(blob, wanted)]
    return [f"plaintext of written values in {len(leaks)} stored places: {leaks[:6]}"] if leaks else []


_KEY_RECORD = re.compile(r"get_object\(m\d+/m/[0-9a-f]{64}\)")
_PUT_CALL = re.compile(r"\s*\d+ (P\d+\.\d+ (?:batch )?put[^#]*)#\d+ (.*)")


def fenced(trace: list[str]) -> bool:
    """Whether a put of the schedule was refused by the key fence: it read its namespace's
    key record after one of its commit's writes (with the key cached, a put reads none)."""
    wrote: set[str] = set()
    for line in trace:
        m = _PUT_CALL.match(line)
        if m is None:
            continue
        label, call = m.groups()
        if _KEY_RECORD.search(call) and label in wrote:
            return True
        if ("put_object" in call and "@head" in call) or any(x in call for x in ("transact_write", "update_item", "put_item")):
            wrote.add(label)
    return False
