"""Issue 21, items 1, 2 and 11: what a thread's archive, export and copy must carry
(every object a served checkpoint reads, whoever owns it), and the saver's own
randomness (never the global state a user may patch or seed)."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from conftest import make_saver
from helpers import config
from soundness_support import RESUME, chain, fresh, read_all, shifted_clock, wipe

from s3_saver import MissingObjectError

BIG = "X" * 200  # over inline_threshold=16: a blob object of its own


def _pruned_thread(endpoint: str, mode: str, thread_id: str):
    """Three checkpoints: the first stores "doc" (a blob object, as the value is over
    inline_threshold), the next two carry it; then prune(keep_last=1). Returns the
    saver and what the kept checkpoint reads."""
    saver = make_saver(endpoint, mode, inline_threshold=16)
    saver.setup()
    chain(saver, thread_id, [{"counter": 0, "doc": BIG}, {"counter": 1}, {"counter": 2}])
    saver.prune([thread_id], keep_last=1)
    kept = read_all(fresh(endpoint, mode, inline_threshold=16), thread_id)
    assert [(ns, values) for ns, _, values, _ in kept] == [("", {"counter": 2, "doc": BIG})]
    return saver, kept


def _read(endpoint: str, mode: str, thread_id: str):
    """The thread as a fresh process reads it; the error's type and text when it cannot."""
    try:
        return read_all(fresh(endpoint, mode, inline_threshold=16), thread_id)
    except MissingObjectError as exc:
        return f"MissingObjectError: {exc}"


# -- item 1: prune keeps a blob whose owner goes; archive/export/copy leave it behind --------
def test_item1_export_of_a_pruned_thread_imports_readable(endpoint, index_mode) -> None:
    """prune keeps the blob of a dropped checkpoint that the kept one reads, but the
    export collects only blobs whose owning checkpoint is in the thread: the import
    lacks it (MissingObjectError on read)."""
    saver, kept = _pruned_thread(endpoint, index_mode, "t")
    saver.import_thread(saver.export_thread("t"), thread_id="imported")
    assert _read(endpoint, index_mode, "imported") == kept


def test_item1_copy_of_a_pruned_thread_is_readable(endpoint, index_mode) -> None:
    """copy_thread copies only the blobs whose owning checkpoint is in the thread:
    the copy of a pruned thread lacks the blob its kept checkpoint reads."""
    saver, kept = _pruned_thread(endpoint, index_mode, "t")
    saver.copy_thread("t", "copied")
    assert _read(endpoint, index_mode, "copied") == kept


def test_item1_archive_of_a_pruned_thread_survives_gc_and_restore(endpoint, index_mode) -> None:
    """archive_thread leaves out the blob whose owner prune dropped and leaves it in
    live/; collect_garbage then sees it unreferenced and deletes it: the archived
    thread, and its restore, cannot be read."""
    saver, kept = _pruned_thread(endpoint, index_mode, "t")
    saver.archive_thread("t")
    saver.collect_garbage(["t"], older_than=timedelta(0))
    assert _read(endpoint, index_mode, "t") == kept, "archived, after gc"
    saver.restore_thread("t")
    assert _read(endpoint, index_mode, "t") == kept, "restored"


def test_item1_archive_of_a_pruned_thread_needs_no_live_object(endpoint, index_mode) -> None:
    """The same without gc: once archived, the thread must not need anything under
    live/ (the archive holds the whole thread); today it still reads the blob the
    archive left out from live/."""
    saver, kept = _pruned_thread(endpoint, index_mode, "t")
    saver.archive_thread("t")
    wipe(endpoint, "live/")
    assert _read(endpoint, index_mode, "t") == kept


# -- item 2: ttl, and an expired ancestor that a live checkpoint reads ----------------------
TTL = 1000  # seconds


@pytest.mark.parametrize("inline_threshold", [16, 64 * 1024], ids=["blob", "inline"])
@pytest.mark.parametrize("how", ["archive", "export"])
def test_item2_expired_ancestor_read_by_a_live_checkpoint_is_archived(
    endpoint, index_mode, monkeypatch, inline_threshold, how
) -> None:
    """With ttl, an unchanged value is stored again only once ttl/2 old, but each entry
    lives a full ttl: a live checkpoint reads a value from an ancestor whose entry
    expired. Archive and export drop expired entries, and with them the ancestor's
    objects: once the live objects go (the lifecycle rule), the archived or imported
    thread cannot be read."""
    with shifted_clock(monkeypatch) as clock:
        saver = make_saver(endpoint, index_mode, inline_threshold=inline_threshold, ttl=timedelta(seconds=TTL))
        saver.setup()
        first = chain(saver, "t", [{"counter": 0, "doc": BIG}])[0]
        clock[0] = 0.4 * TTL  # under ttl/2: "doc" is carried, not stored again
        chain(saver, "t", [{"counter": 1}], parent=first)
        clock[0] = 1.1 * TTL  # the first entry expired; the second lives until 1.4 ttl
        reader = lambda: fresh(endpoint, index_mode, inline_threshold=inline_threshold, ttl=timedelta(seconds=TTL))
        live = read_all(reader(), "t")
        assert [values for _, _, values, _ in live] == [{"counter": 1, "doc": BIG}]
        if how == "archive":
            saver.archive_thread("t")
            target = "t"
        else:
            target = saver.import_thread(saver.export_thread("t"), thread_id="imported")
        # S3's lifecycle rule (1.5 x ttl on live/) removes the source's live objects:
        # the archive (or the imported copy) must not need them.
        wipe(endpoint, "live/t/")
        try:
            seen = read_all(reader(), target)
        except MissingObjectError as exc:
            seen = f"MissingObjectError: {exc}"
        assert seen == live


# -- item 11: the saver's randomness ------------------------------------------------------------
SEALING = 60  # manifest: the head seals at ~48 checkpoints (a seal draws a token)


class _Prepared:
    """Checkpoints built up front (a checkpoint id and get_next_version draw from the
    global random module: that must happen before the seeded window)."""

    def __init__(self, saver) -> None:
        from helpers import checkpoint as cp

        versions = [saver.get_next_version(None)]
        for _ in range(SEALING):
            versions.append(saver.get_next_version(versions[-1]))
        self.first = cp({"counter": 0, "doc": BIG}, {"counter": versions[0], "doc": "1"})
        self.first_new = {"counter": versions[0], "doc": "1"}
        self.rest = [cp({"counter": i, "doc": BIG}, {"counter": versions[i], "doc": "1"}) for i in range(1, SEALING + 1)]
        self.rest_new = [{"counter": versions[i]} for i in range(1, SEALING + 1)]


def _exercise(saver, prepared: _Prepared, racer=None) -> None:
    """Every kind of call: puts (one thread long enough to seal its manifest head),
    pending writes (regular and special), reads, copy, export/import, prune,
    archive/restore (and a write that restores), delete_for_runs, gc, delete."""
    cfg = saver.put(config("t"), prepared.first, {}, prepared.first_new)
    saver.put_writes(cfg, [("counter", 5), (RESUME, "yes")], "task-1", "path")
    for i, (cp, new) in enumerate(zip(prepared.rest, prepared.rest_new)):
        cfg = saver.put(cfg, cp, {"run_id": "r"} if i == SEALING - 1 else {}, new)
    saver.put_writes(cfg, [("counter", 6)], "task-2")
    saver.get_tuple(config("t"))
    list(saver.list(config("t")))
    saver.copy_thread("t", "t2")
    saver.import_thread(saver.export_thread("t"), thread_id="t3")
    saver.prune(["t"], keep_last=2)
    saver.archive_thread("t")
    saver.get_tuple(config("t"))
    saver.restore_thread("t")
    saver.archive_thread("t")
    saver.put_writes(cfg, [("counter", 7)], "task-3")  # restores the thread first
    saver.delete_for_runs(["r"])
    list(saver.list_threads())
    saver.audit(["t", "t2"])
    saver.collect_garbage(["t2"], older_than=timedelta(0))
    saver.delete_thread("t2")


def _uuid4_calls(monkeypatch, run) -> list[str]:
    """The files that called uuid.uuid4 while ``run()`` ran (the immediate caller)."""
    import sys
    import threading

    callers: list[str] = []
    lock = threading.Lock()
    real = uuid.uuid4

    def counting_uuid4():
        frame = sys._getframe(1)
        with lock:
            callers.append(f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})")
        return real()

    with monkeypatch.context() as patch:
        patch.setattr(uuid, "uuid4", counting_uuid4)
        run()
    return callers


def test_item11_saver_code_never_calls_uuid4(endpoint, index_mode, monkeypatch) -> None:
    """LangGraph's tests patch uuid.uuid4 with a deterministic sequence (message ids):
    the saver's own tokens (put_writes' write token, a manifest seal's segment
    token) draw from it and shift the graph's ids (test_large_cases::test_root_graph)."""
    saver = make_saver(endpoint, index_mode, inline_threshold=16)
    saver.setup()
    prepared = _Prepared(saver)
    callers = _uuid4_calls(monkeypatch, lambda: _exercise(saver, prepared))
    own = sorted({c for c in callers if "/s3_saver/" in c})
    assert own == [], f"the saver's own code called uuid.uuid4 {sum('/s3_saver/' in c for c in callers)} times, from {own}"


def test_item11_no_uuid4_is_drawn_on_the_saver_s_behalf(endpoint, index_mode, monkeypatch) -> None:
    """Stricter: a user's patched uuid.uuid4 sequence is shifted by any draw during a
    saver call, the saver's own or botocore's on its behalf (each request's retry
    "invocation-id", DynamoDB's auto-filled ClientRequestToken of
    TransactWriteItems): LangGraph's test sees shifted ids with this saver either way."""
    saver = make_saver(endpoint, index_mode, inline_threshold=16)
    saver.setup()
    prepared = _Prepared(saver)
    callers = _uuid4_calls(monkeypatch, lambda: _exercise(saver, prepared))
    by_file: dict[str, int] = {}
    for c in callers:
        by_file[c] = by_file.get(c, 0) + 1
    assert callers == [], f"uuid.uuid4 drawn {len(callers)} times during saver calls: {by_file}"


def test_item11_saver_leaves_the_global_random_state_alone(endpoint, index_mode, monkeypatch) -> None:
    """A user who seeds ``random`` gets the same sequence whatever the saver did:
    nothing but get_next_version (left out, as InMemorySaver's uses it too) may draw
    from the global ``random`` module. Today the retry jitter and the manifest
    head's swap backoff draw from it (both exercised here: a transient failure, and
    a second writer making a head swap lose)."""
    from botocore.exceptions import EndpointConnectionError

    from s3_saver._transport.sync import SyncDriver

    saver = make_saver(endpoint, index_mode, inline_threshold=16)
    saver.setup()
    other = fresh(endpoint, index_mode, inline_threshold=16)
    prepared = _Prepared(saver)
    base = saver.put(config("race"), prepared.first, {}, prepared.first_new)
    other_cp, other_new = prepared.rest[0], prepared.rest_new[0]
    real = SyncDriver._wave
    state = {"failed": False, "raced": False, "busy": False}

    def wave(driver, calls):
        if state["busy"]:
            return real(driver, calls)
        if not state["failed"]:
            state["failed"] = True  # one transient failure: the call is sent again after a backoff
            return [EndpointConnectionError(endpoint_url=endpoint) for _ in calls]
        if not state["raced"] and any(c.operation == "put_object" and "IfMatch" in c.params for c in calls):
            state["raced"] = True  # another writer swaps the head first: this swap loses
            state["busy"] = True
            try:
                other.put(base, other_cp, {}, other_new)
            finally:
                state["busy"] = False
        return real(driver, calls)

    import sys

    drawn: dict[str, int] = {}

    def recording(name: str):
        real_fn = getattr(random, name)

        def draw(*args, **kwargs):
            frame = sys._getframe(1)
            where = f"{name} from {frame.f_code.co_filename}:{frame.f_lineno}"
            drawn[where] = drawn.get(where, 0) + 1
            return real_fn(*args, **kwargs)

        return draw

    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    with monkeypatch.context() as patch:
        for name in ("random", "uniform", "getrandbits", "randint", "randrange", "choice", "choices", "shuffle", "sample"):
            patch.setattr(random, name, recording(name))
        with monkeypatch.context() as racing:
            racing.setattr(SyncDriver, "_wave", wave)
            saver.put(base, prepared.rest[1], {}, prepared.rest_new[1])  # fails once, races (manifest)
        _exercise(saver, prepared)
    after = [random.random() for _ in range(3)]
    assert state["failed"] and (state["raced"] or index_mode == "dynamodb")
    assert after == expected, f"the saver drew from the global random module: {drawn}"
