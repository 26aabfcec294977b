"""Issue 21, items 5 and 12: whole-thread switches (restore, delete, archive) of a
thread with more namespaces than one DynamoDB transaction takes (100 actions),
cut short at every round trip and called again from another process; and what a
deleted thread leaves in the bucket and the table."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conftest import make_saver
from helpers import READS, config, long_form, store_changing_cuts
from soundness_support import Cut, chain, fresh, leftovers, reset

from s3_saver import MissingObjectError, ThreadArchivedError
from s3_saver._transport.sync import SyncDriver

# More than one transaction's worth (100 actions: the thread's item and 99 markers),
# few enough to loop over every round trip in seconds.
NAMESPACES = 110


def _namespaces() -> list[str]:
    return [f"sub{i}:" + str(uuid.UUID(int=i)) for i in range(NAMESPACES)]


def _wide_thread(saver, thread_id: str) -> None:
    """The root namespace and 120 subgraph namespaces, one checkpoint each."""
    chain(saver, thread_id, [{"n": "root", "doc": "D"}])
    for i, ns in enumerate(_namespaces()):
        chain(saver, thread_id, [{"n": i}], ns=ns)


def _each(saver, thread_id: str) -> dict[Any, Any]:
    """How each namespace reads: ``list`` of the whole thread (latest values per
    namespace), and get_tuple of the namespaces past the first hundred in key order
    (those of the second transaction) and of a few before (None: it reads empty;
    an error's name)."""
    out: dict[Any, Any] = {}
    spaces = sorted(["", *_namespaces()])
    try:
        for t in saver.list({"configurable": {"thread_id": thread_id}}):
            out.setdefault(("list", t.config["configurable"]["checkpoint_ns"]), t.checkpoint["channel_values"])
    except (MissingObjectError, ThreadArchivedError) as exc:
        out[("list", "*")] = type(exc).__name__
    for ns in spaces[:3] + spaces[95:]:
        try:
            found = saver.get_tuple(config(thread_id, ns))
            out[("get", ns)] = None if found is None else found.checkpoint["channel_values"]
        except (MissingObjectError, ThreadArchivedError) as exc:
            out[("get", ns)] = type(exc).__name__
    return out


def _differences(seen: dict[Any, Any], expected: dict[Any, Any]) -> str | None:
    keys = sorted(set(seen) | set(expected))
    wrong = {k: seen.get(k, "absent") for k in keys if seen.get(k, "absent") != expected.get(k, "absent")}
    if not wrong:
        return None
    kinds: dict[str, int] = {}
    for (how, _), value in wrong.items():
        kind = f"{how}: {repr(value)[:40]}"
        kinds[kind] = kinds.get(kind, 0) + 1
    return f"{len(wrong)} of {len(keys)} reads wrong: {kinds}, e.g. {list(wrong)[:2]}"


def _exported(endpoint: str, mode: str) -> tuple[bytes, dict[str, Any]]:
    """The wide thread's export (each case imports it: one request per 100 objects)
    and how each namespace reads."""
    writer = make_saver(endpoint, mode)
    writer.setup()
    _wide_thread(writer, "source")
    data = writer.export_thread("source")
    before = _each(fresh(endpoint, mode), "source")
    assert len(before) == 1 + NAMESPACES + 3 + (NAMESPACES + 1 - 95) and all(isinstance(v, dict) for v in before.values())
    writer.close()
    return data, before


def _operations(call, monkeypatch) -> list[tuple[str, bool]]:
    """The operation of each round trip ``call()`` takes, and whether it changed the store."""
    seen: list[tuple[str, bool]] = []
    real = SyncDriver._wave

    def wave(driver, calls):
        seen.append((calls[0].operation, any(c.operation not in READS for c in calls)))
        return real(driver, calls)

    with monkeypatch.context() as patch:
        patch.setattr(SyncDriver, "_wave", wave)
        call()
    return seen


def _cases(endpoint: str, mode: str, monkeypatch, prepare, call, check, every: bool = True) -> list[Any]:
    """For each round trip of ``call(saver, thread_id)``: a fresh thread made by
    ``prepare(saver, thread_id)``, the call cut after that many round trips, then
    the same call again from another process; ``check(thread_id)`` says what is
    wrong (or None). ``every=False``: moto takes a second or two per transaction of
    100 actions, so only the cuts right after a transaction (a switch) are tried,
    but in ``make test-all``."""
    reset(endpoint, mode)
    setup = make_saver(endpoint, mode)
    prepare(setup, "twin")
    waves = _operations(lambda: call(fresh(endpoint, mode), "twin"), monkeypatch)
    ops = [op for op, _ in waves]
    total = len(ops)
    cuts = store_changing_cuts([changes for _, changes in waves])
    if not every and not long_form() and "transact_write_items" in ops:
        cuts = [k for k in cuts if k and ops[k - 1] == "transact_write_items"]
    bad = []
    for cut in cuts:
        reset(endpoint, mode)
        thread_id = f"t{cut}"
        prepare(setup, thread_id)
        first = fresh(endpoint, mode)
        with monkeypatch.context() as patch:
            cutter = Cut(patch, cut)
            try:
                call(first, thread_id)
            except ConnectionError:
                pass
        assert cutter.fired, cut
        try:
            call(fresh(endpoint, mode), thread_id)  # again, in another process: it completes
        except Exception as exc:  # noqa: BLE001 - reported with the case
            bad.append((f"cut after {cut} of {total} round trips", f"the call again raised {type(exc).__name__}: {exc}"))
            continue
        wrong = check(thread_id)
        if wrong is not None:
            bad.append((f"cut after {cut} of {total} round trips", wrong))
    return bad


def test_item5_restore_of_a_wide_thread_cut_short_then_called_again(endpoint, index_mode, monkeypatch) -> None:
    """DynamoDB switches the namespaces' markers in transactions of 100 actions: after
    the first, the thread's own item says "live", so a restore called again only
    deletes the archive object, and the namespaces of the later transactions stay
    marked archived with no archive: unreadable for good."""
    data, before = _exported(endpoint, index_mode)

    def prepare(saver, thread_id: str) -> None:
        saver.import_thread(data, thread_id=thread_id)
        fresh(endpoint, index_mode).archive_thread(thread_id)

    def check(thread_id: str) -> Any:
        return _differences(_each(fresh(endpoint, index_mode), thread_id), before)

    bad = _cases(endpoint, index_mode, monkeypatch, prepare, lambda s, t: s.restore_thread(t), check, every=False)
    assert bad == [], "\n".join(map(repr, bad))


def test_item5_delete_of_an_archived_wide_thread_cut_short_then_called_again(endpoint, index_mode, monkeypatch) -> None:
    """delete_thread of an archived thread, cut after its first request and called
    again: every namespace must read empty (none reads from the archive, none fails)."""
    data, before = _exported(endpoint, index_mode)

    def prepare(saver, thread_id: str) -> None:
        saver.import_thread(data, thread_id=thread_id)
        fresh(endpoint, index_mode).archive_thread(thread_id)

    def check(thread_id: str) -> Any:
        return _differences(_each(fresh(endpoint, index_mode), thread_id), {k: None for k in before if k[0] == "get"})

    bad = _cases(endpoint, index_mode, monkeypatch, prepare, lambda s, t: s.delete_thread(t), check)
    assert bad == [], "\n".join(map(repr, bad))


def test_item5_archive_of_a_wide_thread_cut_short_then_called_again(endpoint, index_mode, monkeypatch) -> None:
    """archive_thread of a thread with more than 99 namespaces, cut after its first
    marker transaction and called again: the call again skips the marker writes,
    then deletes the unmarked namespaces' entries (they read empty until a
    restore). Every namespace must read as before, archived and once restored."""
    data, before = _exported(endpoint, index_mode)

    def prepare(saver, thread_id: str) -> None:
        saver.import_thread(data, thread_id=thread_id)

    def check(thread_id: str) -> Any:
        archived = _differences(_each(fresh(endpoint, index_mode), thread_id), before)
        fresh(endpoint, index_mode).restore_thread(thread_id)
        restored = _differences(_each(fresh(endpoint, index_mode), thread_id), before)
        return None if archived is None and restored is None else f"archived: {archived}; restored: {restored}"

    bad = _cases(endpoint, index_mode, monkeypatch, prepare, lambda s, t: s.archive_thread(t), check, every=False)
    assert bad == [], "\n".join(map(repr, bad))


# -- found on the way: a cut between deleting buried segments and the head swap ------------------
LONG = 100  # a manifest head seals at ~48 checkpoints: this thread has sealed segments


@pytest.mark.parametrize("operation", ["archive_thread", "prune", "delete_thread"])
def test_extra_cut_after_deleting_sealed_segments_then_called_again(endpoint, index_mode, monkeypatch, operation) -> None:
    """Not in issue 21. Manifest: clearing the graveyard deletes the buried segments,
    then swaps the head that still lists them; cut between the two, the call again
    reads the head's buried segments first and fails on the missing object
    (MissingObjectError), every time: the archive (or prune, or delete) can never be
    finished. Whatever the cut, the call again completes and the thread reads right."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    chain(writer, "source", [{"counter": i, "doc": "D"} if i == 0 else {"counter": i} for i in range(LONG)])
    data = writer.export_thread("source")
    latest = writer.get_tuple(config("source")).checkpoint["channel_values"]
    history = [t.checkpoint["channel_values"] for t in writer.list(config("source"))]
    assert len(history) == LONG

    def call(saver, thread_id: str) -> None:
        if operation == "prune":
            saver.prune([thread_id], keep_last=1)
        else:
            getattr(saver, operation)(thread_id)

    expected = {"archive_thread": history, "prune": [latest], "delete_thread": []}[operation]

    def check(thread_id: str) -> Any:
        try:
            seen = [t.checkpoint["channel_values"] for t in fresh(endpoint, index_mode).list(config(thread_id))]
        except MissingObjectError as exc:
            return f"MissingObjectError: {exc}"
        return None if seen == expected else f"reads {len(seen)} checkpoints, not {len(expected)}"

    bad = _cases(endpoint, index_mode, monkeypatch, lambda s, t: s.import_thread(data, thread_id=t), call, check)
    assert bad == [], "\n".join(map(repr, bad))


# -- item 12: what a deleted thread leaves behind --------------------------------------------------
def _busy_thread(endpoint: str, mode: str, monkeypatch, thread_id: str) -> None:
    """~90 checkpoints (runs, pending writes, a subgraph namespace) written by two
    processes on two branches, each head swap of the first (manifest: a conditional
    PUT) preceded by a put of the second, so that the first's swaps lose and its
    seals race the other's; in DynamoDB mode they simply alternate."""
    a = make_saver(endpoint, mode)
    a.setup()
    b = fresh(endpoint, mode)
    (root,) = chain(a, thread_id, [{"counter": 0, "doc": "D"}], run_id="run-a")
    state: dict[str, Any] = {"b": root, "busy": False, "armed": False}

    def b_put() -> None:
        state["armed"], state["busy"] = False, True
        try:
            (state["b"],) = chain(b, thread_id, [{"counter": 1, "tag": "b"}], parent=state["b"], run_id="run-b")
        finally:
            state["busy"] = False

    real = SyncDriver._wave

    def wave(driver, calls):
        swap = any(c.operation == "put_object" and "IfMatch" in c.params for c in calls)
        if swap and state["armed"] and not state["busy"]:
            b_put()
        return real(driver, calls)

    cfg = root
    with monkeypatch.context() as patch:
        patch.setattr(SyncDriver, "_wave", wave)
        for i in range(45):
            state["armed"] = True
            (cfg,) = chain(a, thread_id, [{"counter": i, "tag": "a"}], parent=cfg, run_id="run-a")
            if state["armed"]:  # no conditional PUT (DynamoDB): the other writes after
                b_put()
            if i % 10 == 0:
                a.put_writes(cfg, [("counter", i)], f"task-{i}", "path")
    chain(a, thread_id, [{"n": 1}, {"n": 2}], ns="child:" + str(uuid.UUID(int=7)), run_id="run-a")
    assert len(list(fresh(endpoint, mode).list(config(thread_id, "")))) >= 90


@pytest.mark.parametrize("archived", [False, True], ids=["live", "archived"])
def test_item12_delete_thread_leaves_at_most_one_small_record(endpoint, index_mode, monkeypatch, archived) -> None:
    """After delete_thread, the thread's data is gone: at most one small item or
    object (a tombstone, <= 2 KB) may name it. Manifest: segments sealed by a seal
    that lost its head swap (duplicates) stay, and so does the run record; DynamoDB:
    the namespace tombstones and the run records stay beside the thread's tombstone."""
    _busy_thread(endpoint, index_mode, monkeypatch, "victim")
    chain(make_saver(endpoint, index_mode), "bystander", [{"counter": 0}], run_id="run-a")
    if archived:
        fresh(endpoint, index_mode).archive_thread("victim")
    fresh(endpoint, index_mode).delete_thread("victim")
    found_objects, found_items = leftovers(endpoint, "victim")
    left = [*found_objects.items(), *found_items]
    assert len(left) <= 1 and all(size <= 2048 for _, size in left), (
        f"{len(found_objects)} objects and {len(found_items)} items of the deleted thread remain "
        f"({sum(size for _, size in left)} bytes): {left}"
    )
    # The bystander is untouched.
    assert [t.checkpoint["channel_values"] for t in fresh(endpoint, index_mode).list(config("bystander"))] == [{"counter": 0}]
