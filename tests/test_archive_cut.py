"""archive_thread and restore_thread cut short at any round trip (a Lambda timing out
between two requests), a write that restores an archived thread cut short, and a
write racing the archive: the thread always reads as before, from the live objects or
from the archive, and the same call again completes the job, in both index modes."""

from __future__ import annotations

import threading
import urllib.request
from typing import Any

import boto3
from datetime import timedelta

import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.memory import InMemorySaver

from conftest import BUCKET, make_saver
from helpers import checkpoint, cut_points, grow_thread, is_marker
from soundness_support import fresh
from s3_saver import ThreadArchivedError
from s3_saver._transport.sync import SyncDriver
from s3_saver._index.manifest.seal import SEAL_AT
from test_archive import _logical
from test_lifecycle import _graph, _run

RESUME = next(ch for ch, idx in WRITES_IDX_MAP.items() if idx == -4)
SUB_NS = "child:" + "1" * 36
TURNS = 3  # a turn of _graph writes 4 checkpoints


# -- helpers -------------------------------------------------------------------------------
class _Cut:
    """Every round trip of every SyncDriver (or of ``only``) fails once ``waves`` were
    sent: the process died between two requests. Thread-safe (LangGraph puts from a
    background pool)."""

    def __init__(self, monkeypatch, waves: int, only: SyncDriver | None = None) -> None:
        self.left = waves
        self.fired = False
        lock = threading.Lock()
        real = SyncDriver._wave

        def wave(driver, calls):
            if only is not None and driver is not only:
                return real(driver, calls)  # another process: not cut
            with lock:
                if self.left == 0:
                    self.fired = True
                    raise ConnectionError("the Lambda timed out")
                self.left -= 1
            return real(driver, calls)

        monkeypatch.setattr(SyncDriver, "_wave", wave)


def _empty(endpoint: str, writer) -> None:
    """Empty the moto server for the next case (moto slows down as it fills up)."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()
    writer.setup()


def _objects(endpoint: str, prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []) if not is_marker(o["Key"]))


def _cfg(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _history(saver, thread_id: str) -> list[tuple]:
    """What the graph's reader sees: the whole root history, newest first."""
    return [
        (s.config, s.values, s.metadata, s.parent_config, s.next, s.created_at)
        for s in _graph(saver).get_state_history(_cfg(thread_id))
    ]


def _raw(saver, thread_id: str) -> list[tuple]:
    """Every checkpoint of every namespace, whole, with its pending writes."""
    return [
        (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
        for t in saver.list(_cfg(thread_id))
    ]


def _latest(saver, thread_id: str) -> tuple:
    found = [saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}) for ns in ("", SUB_NS)]
    return tuple(None if t is None else (t.config, t.checkpoint, t.metadata, t.pending_writes) for t in found)


def _view(endpoint: str, mode: str, thread_id: str) -> tuple:
    """The thread as a fresh process (nothing cached) reads it: get_state_history,
    list (all namespaces, pending writes) and get_tuple of each namespace."""
    reader = fresh(endpoint, mode)
    try:
        return _history(reader, thread_id), _raw(reader, thread_id), _latest(reader, thread_id)
    finally:
        reader.close()


def _values(saver, thread_id: str) -> list[dict]:
    return _graph_values(_graph(saver), thread_id)


def _graph_values(graph, thread_id: str) -> list[dict]:
    return [s.values for s in graph.get_state_history(_cfg(thread_id))]


def _brief(values: list[dict]) -> list[tuple]:
    """Values for a failure message: the log and the turn (not the 2 KB document)."""
    return [(v.get("log"), v.get("turn"), "doc" in v) for v in values]


def _fresh_values(endpoint: str, mode: str, thread_id: str) -> list[dict]:
    reader = fresh(endpoint, mode)
    try:
        return _values(reader, thread_id)
    finally:
        reader.close()


def _rich_thread(saver, thread_id: str) -> None:
    """TURNS graph turns, then a subgraph namespace with a value in a blob object of
    its own and pending writes on its latest checkpoint."""
    _run((_graph(saver),), thread_id, range(TURNS))
    sub = grow_thread(saver, thread_id, 2, ns=SUB_NS)
    latest = saver.get_tuple(sub)
    versions = {**latest.checkpoint["channel_versions"], "big": "1"}
    values = {"counter": 9, "doc": "a document", "big": "B" * 100_000}  # over inline_threshold
    sub = saver.put(sub, checkpoint(values, versions), {"step": 9}, {"big": "1"})
    saver.put_writes(sub, [("counter", 10), (RESUME, "yes")], "task-1", "path")


def _index_marks(saver, thread_id: str):
    """The thread's archive marker and "stale archive" mark, as its index holds them."""
    own = saver._sync.run(saver._ctx.index.archive_of(thread_id))
    return own.archive, own.stale_archive


def _waves(saver, call) -> int:
    saver.stats.reset()
    call()
    return saver.stats.round_trips



def _cut_short(monkeypatch, cut: int, call) -> None:
    """Run ``call`` with a ConnectionError after round trip ``cut`` (the cut must come)."""
    with monkeypatch.context() as patch:
        cutter = _Cut(patch, cut)
        with pytest.raises(ConnectionError):
            call()
        assert cutter.fired

# -- 1. archive cut short ----------------------------------------------------------------------
def test_archive_cut_after_any_round_trip_reads_whole_and_completes(endpoint, index_mode, monkeypatch) -> None:
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    _rich_thread(writer, "twin")
    counter = fresh(endpoint, index_mode)  # as the cut cases' archiver: cold
    total = _waves(counter, lambda: counter.archive_thread("twin"))
    print(f"\n{index_mode}: archive_thread takes {total} round trips")
    assert total >= 4

    for cut in cut_points(total):
        _empty(endpoint, writer)
        thread_id = f"t{cut}"
        _rich_thread(writer, thread_id)
        before = _view(endpoint, index_mode, thread_id)
        assert len(before[0]) == 4 * TURNS and len(before[1]) == 4 * TURNS + 3
        archiver = fresh(endpoint, index_mode)
        _cut_short(monkeypatch, cut, lambda: archiver.archive_thread(thread_id))
        assert _view(endpoint, index_mode, thread_id) == before, cut
        left = archiver.audit([thread_id], older_than=timedelta(0))
        assert not left.missing and not left.broken and not left.unindexed, (cut, left.problems)

        status = archiver.archive_thread(thread_id)  # run again (same process), it completes
        assert status.state == "archived", cut
        archived = _objects(endpoint, f"archive/{thread_id}/")
        assert archived == [status.key], (cut, archived)
        assert _objects(endpoint, f"live/{thread_id}/") == [], cut
        marker, stale = _index_marks(archiver, thread_id)
        assert (marker.key, stale) == (status.key, None), cut
        assert _view(endpoint, index_mode, thread_id) == before, cut
        # A third call changes nothing.
        assert archiver.archive_thread(thread_id).key == status.key
        assert _objects(endpoint, f"archive/{thread_id}/") == archived
        # What the completed archive holds restores whole.
        assert archiver.restore_thread(thread_id).state == "live"
        assert _objects(endpoint, f"archive/{thread_id}/") == [], cut
        assert _view(endpoint, index_mode, thread_id) == before, cut
        assert archiver.audit([thread_id], older_than=timedelta(0)).problems == [], cut
        archiver.close()
    writer.close()


# -- 2. restore cut short ------------------------------------------------------------------------
def test_restore_cut_after_any_round_trip_reads_whole_and_completes(endpoint, index_mode, monkeypatch) -> None:
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    _rich_thread(writer, "twin")
    writer.archive_thread("twin")
    counter = fresh(endpoint, index_mode)  # as the cut cases' restorer: cold
    total = _waves(counter, lambda: counter.restore_thread("twin"))
    print(f"\n{index_mode}: restore_thread takes {total} round trips")
    assert total >= 3
    ref = _graph(InMemorySaver())
    _run((ref,), "ref", range(TURNS + 1))
    expected_after = _graph_values(ref, "ref")

    for cut in cut_points(total):
        _empty(endpoint, writer)
        thread_id = f"t{cut}"
        _rich_thread(writer, thread_id)
        before = _view(endpoint, index_mode, thread_id)
        live = _objects(endpoint, f"live/{thread_id}/")
        writer.archive_thread(thread_id)
        assert _view(endpoint, index_mode, thread_id) == before
        restorer = fresh(endpoint, index_mode)
        _cut_short(monkeypatch, cut, lambda: restorer.restore_thread(thread_id))
        assert _view(endpoint, index_mode, thread_id) == before, cut

        assert restorer.restore_thread(thread_id).state == "live", cut  # run again, it completes
        assert _objects(endpoint, f"archive/{thread_id}/") == [], cut
        # The objects a restore cut short wrote carry a tag no entry names (the call
        # again writes its own, under a new one): garbage, and nothing else is.
        report = restorer.collect_garbage([thread_id], older_than=timedelta(0))
        assert all("@" in key or "/writes/" in key for key in report.deleted), (cut, report.deleted)
        assert _logical(_objects(endpoint, f"live/{thread_id}/")) == _logical(live), cut
        assert _index_marks(restorer, thread_id) == (None, None), cut
        assert _view(endpoint, index_mode, thread_id) == before, cut
        assert restorer.restore_thread(thread_id).state == "live"  # a live thread is left as it is
        # The graph goes on, in another process.
        other = fresh(endpoint, index_mode)
        _run((_graph(other),), thread_id, range(TURNS, TURNS + 1))
        assert _values(other, thread_id) == expected_after, cut
        history = _view(endpoint, index_mode, thread_id)[0]
        assert history[4:] == before[0], cut  # the old history, untouched, under the new turn
        for s in (restorer, other):
            s.close()
    writer.close()


# -- 3. a write that restores an archived thread, cut short -----------------------------------------
def test_a_write_restoring_an_archived_thread_cut_short_loses_and_doubles_nothing(
    endpoint, index_mode, monkeypatch
) -> None:
    turns = 2  # the restores this turn runs (one per concurrent put) write every object: a short thread
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    ref = _graph(InMemorySaver())
    _run((ref,), "ref", range(turns + 2))
    expected = _graph_values(ref, "ref")  # after turns + 2 turns
    with_turn = expected[4:]  # after turns + 1 turns
    _run((_graph(writer),), "twin", range(turns))
    # Each case's thread is this one, imported (one request per object, not a graph run).
    exported = writer.export_thread("twin")
    writer.archive_thread("twin")
    counter = fresh(endpoint, index_mode)  # as the cut cases' invoker: cold
    total = _waves(counter, lambda: _run((_graph(counter),), "twin", range(turns, turns + 1)))
    print(f"\n{index_mode}: a turn on an archived thread takes {total} round trips")
    assert _values(writer, "twin") == with_turn
    counter.close()

    for cut in cut_points(total):
        _empty(endpoint, writer)
        thread_id = f"t{cut}"
        writer.import_thread(exported, thread_id=thread_id)
        before = with_turn[4:]
        if cut == 0:  # the same bytes each time
            assert _values(writer, thread_id) == before
        writer.archive_thread(thread_id)
        invoker = fresh(endpoint, index_mode)
        with monkeypatch.context() as patch:
            cutter = _Cut(patch, cut)
            try:
                _run((_graph(invoker),), thread_id, range(turns, turns + 1))
            except ConnectionError:
                pass
            # LangGraph's puts run on a pool: the turn may take fewer round trips than the twin's.
        reader = fresh(endpoint, index_mode)
        seen = _values(reader, thread_id)
        # The old history whole, under the new turn's first checkpoints that committed.
        state = (cut, "cut" if cutter.fired else "not cut", len(seen))
        assert len(seen) >= len(before) and seen == with_turn[len(with_turn) - len(seen) :], (state, _brief(seen))
        if not cutter.fired:
            assert seen == with_turn, (state, _brief(seen))

        # The next invoke (another process) finishes the turn: the run cut short goes on
        # from its last checkpoint (its tasks' committed writes count), or the turn
        # starts again when none of it committed; when all of it did, the next turn runs.
        resumer = fresh(endpoint, index_mode)
        graph = _graph(resumer)
        if len(seen) == len(before):
            _run((graph,), thread_id, range(turns, turns + 1))
        elif len(seen) < len(with_turn):
            graph.invoke(None, _cfg(thread_id))
        else:
            _run((graph,), thread_id, range(turns + 1, turns + 2))
        # Each checkpoint once, none missing, in a fresh process and in the reader that
        # read before (warm caches).
        done = with_turn if len(seen) < len(with_turn) else expected
        cold = _fresh_values(endpoint, index_mode, thread_id)
        assert cold == done, (state, "fresh reader", _brief(cold))
        warm = _values(reader, thread_id)
        assert warm == done, (state, "warm reader", _brief(warm))
        # A restore may leave its archive object to delete: restore_thread clears it.
        assert resumer.restore_thread(thread_id).state == "live"
        assert _objects(endpoint, f"archive/{thread_id}/") == [], state
        assert _index_marks(resumer, thread_id) == (None, None), state
        for s in (invoker, reader, resumer):
            s.close()
    writer.close()


# -- 4. a write racing the archive ----------------------------------------------------------------
def _race_at_archive_put(monkeypatch, racer) -> list[str]:
    """Just before archive_thread writes its archive object (it has read the thread,
    it has not switched the index yet), ``racer()`` runs: another process writes."""
    real = SyncDriver._wave
    fired: list[str] = []

    def wave(driver, calls):
        keys = [str(c.params.get("Key", "")) for c in calls if c.operation == "put_object"]
        if not fired and any(k.startswith("archive/") for k in keys):
            fired.append(next(k for k in keys if k.startswith("archive/")))
            racer()
        return real(driver, calls)

    monkeypatch.setattr(SyncDriver, "_wave", wave)
    return fired


def _checkpoint_ids(raw: list[tuple]) -> list[tuple[str, str]]:
    return [(c["configurable"]["checkpoint_ns"], c["configurable"]["checkpoint_id"]) for c, *_ in raw]


# A thread whose manifest head is full (SEAL_AT checkpoints, none sealed yet): the
# racing turn seals it, so the sealed history changes under the archive.
SEALING_TURNS = SEAL_AT // 4


@pytest.mark.parametrize("turns", [TURNS, SEALING_TURNS], ids=["short", "sealing"])
def test_a_checkpoint_racing_the_archive_is_never_lost(endpoint, index_mode, monkeypatch, turns) -> None:
    """Between archive_thread's read of the thread and its switch, another process runs
    a turn. Its commits are checked against the thread's record (a DynamoDB
    transaction's condition takes the archive's mark off; the manifest head the
    switch is conditioned on changes): the archive is refused, nothing archived,
    and readers see the racing turn at once. Archived again and restored, every
    checkpoint before and of the racing turn reads as it was written, once, and no
    archive object is left."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    ref = _graph(InMemorySaver())
    _run((ref,), "ref", range(turns + 2))
    all_values = _graph_values(ref, "ref")
    with_race = all_values[4:]  # turns + 1 turns: the racing one included
    _run((_graph(writer),), "t", range(turns))
    before = _view(endpoint, index_mode, "t")
    assert [v for _, v, *_ in before[0]] == with_race[4:]

    archiver, racer = fresh(endpoint, index_mode), fresh(endpoint, index_mode)
    with monkeypatch.context() as patch:
        fired = _race_at_archive_put(patch, lambda: _run((_graph(racer),), "t", range(turns, turns + 1)))
        with pytest.raises(ThreadArchivedError, match="written to while it was being archived"):
            archiver.archive_thread("t")
    assert fired
    raced = _view(endpoint, index_mode, "t")
    # Nothing archived: the thread is live, with the racing turn over the old history.
    assert _index_marks(archiver, "t") == (None, None)
    assert [v for _, v, *_ in raced[0]] == with_race
    assert raced[0][4:] == before[0]
    status = archiver.archive_thread("t")  # again: the whole thread goes now
    assert _view(endpoint, index_mode, "t") == raced
    assert _objects(endpoint, "live/t/") == []
    assert status.state == "archived"
    archive_objects = _objects(endpoint, "archive/t/")
    assert status.key in archive_objects

    assert archiver.restore_thread("t").state == "live"
    assert _index_marks(archiver, "t") == (None, None)
    after = _view(endpoint, index_mode, "t")
    # Nothing lost: the history before the archive, each checkpoint as it read (values,
    # metadata, pending writes), and the racing turn's 4 checkpoints over it, once each.
    assert [v for _, v, *_ in after[0]] == with_race
    assert after[0][4:] == before[0]
    assert after[1][4:] == before[1]
    ids = _checkpoint_ids(after[1])
    assert len(set(ids)) == len(ids) == len(before[1]) + 4
    # And the thread goes on.
    _run((_graph(writer),), "t", range(turns + 1, turns + 2))
    assert _fresh_values(endpoint, index_mode, "t") == all_values
    # Archived once complete, one archive object; restored, none (nothing left behind).
    assert archive_objects == [status.key], "an archive object of the refused attempt is left behind"
    assert _objects(endpoint, "archive/t/") == []
    for s in (writer, archiver, racer):
        s.close()


def test_a_pending_write_racing_the_archive_survives_a_cut_and_the_call_again(
    endpoint, index_mode, monkeypatch
) -> None:
    """A run resumed on an idle thread (an interrupt answered, a task retried) writes
    pending writes to its newest checkpoint while the archive runs, between its read of
    the thread and its switch. Its commit is checked against the thread's record, so
    the archive is refused ("written to while it was being archived") when it is not
    cut short first. Cut short at any round trip and called again: the write is never
    lost nor hidden (readers see it at once), the archive called again holds it, it
    shows once restored, and no archive object is left behind."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    late = ("task-late", "log", ["late"])

    def prepare(thread_id: str) -> dict[str, Any]:
        _run((_graph(writer),), thread_id, range(TURNS))
        return writer.get_tuple(_cfg(thread_id)).config

    def race(latest: dict[str, Any], racer) -> None:
        racer.put_writes(latest, [late[1:]], late[0], "path")

    latest = prepare("twin")
    racer = fresh(endpoint, index_mode)
    archiver = fresh(endpoint, index_mode)
    with monkeypatch.context() as patch:
        fired = _race_at_archive_put(patch, lambda: race(latest, racer))
        archiver.stats.reset()
        with pytest.raises(ThreadArchivedError, match="written to while it was being archived"):
            archiver.archive_thread("twin")
        total = archiver.stats.round_trips
    assert fired
    print(f"\n{index_mode}: archive_thread raced by a pending write takes {total} round trips")

    left_behind = []
    for cut in cut_points(total):
        _empty(endpoint, writer)
        thread_id = f"t{cut}"
        latest = prepare(thread_id)
        before = _view(endpoint, index_mode, thread_id)
        assert before[1][0][4] == []  # the newest checkpoint: no pending writes yet
        with_late = [*before[1][:1][0][:4], [late]]
        archiver = fresh(endpoint, index_mode)
        with monkeypatch.context() as patch:
            fired = _race_at_archive_put(patch, lambda: race(latest, racer))
            cutter = _Cut(patch, cut, only=archiver._sync)
            with pytest.raises((ConnectionError, ThreadArchivedError)):
                archiver.archive_thread(thread_id)
        if not fired:
            race(latest, racer)  # cut before the archive object: the write comes after the cut
        # The write shows at once; everything else as before.
        seen = _view(endpoint, index_mode, thread_id)
        assert seen[0] == before[0], cut  # pending writes do not change the history
        assert seen[1][1:] == before[1][1:], cut
        assert list(seen[1][0]) == with_late, (cut, cutter.fired)

        status = archiver.archive_thread(thread_id)  # run again, it completes
        assert status.state == "archived", cut
        archived = _view(endpoint, index_mode, thread_id)
        assert archived == seen, cut
        if _objects(endpoint, f"archive/{thread_id}/") != [status.key]:
            left_behind.append((cut, "archived", _objects(endpoint, f"archive/{thread_id}/")))

        assert archiver.restore_thread(thread_id).state == "live", cut
        assert _view(endpoint, index_mode, thread_id) == seen, cut
        if _objects(endpoint, f"archive/{thread_id}/"):
            left_behind.append((cut, "restored", _objects(endpoint, f"archive/{thread_id}/")))
        archiver.close()
    for s in (writer, racer):
        s.close()
    assert left_behind == [], f"archive objects left behind (cut, when, objects): {left_behind}"


# -- 5. an archive cut short, the thread written to, the archive called again ------------------------
def test_an_archive_cut_short_then_written_to_then_archived_again_leaves_one_archive_object(
    endpoint, index_mode, monkeypatch
) -> None:
    """Between a cut-short archive_thread and its call again, the user comes back (a new
    turn, which restores the thread if it was archived): the archive called again holds
    the new turn too, and the bucket holds exactly one archive object of the thread,
    none once it is restored."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    ref = _graph(InMemorySaver())
    _run((ref,), "ref", range(TURNS + 1))
    expected = _graph_values(ref, "ref")
    _run((_graph(writer),), "twin", range(TURNS))
    counter = fresh(endpoint, index_mode)
    total = _waves(counter, lambda: counter.archive_thread("twin"))
    counter.close()

    left_behind = []
    for cut in cut_points(total):
        _empty(endpoint, writer)
        thread_id = f"t{cut}"
        _run((_graph(writer),), thread_id, range(TURNS))
        archiver = fresh(endpoint, index_mode)
        _cut_short(monkeypatch, cut, lambda: archiver.archive_thread(thread_id))
        user = fresh(endpoint, index_mode)
        _run((_graph(user),), thread_id, range(TURNS, TURNS + 1))
        assert _fresh_values(endpoint, index_mode, thread_id) == expected, cut

        status = archiver.archive_thread(thread_id)  # again: the thread with its new turn
        assert status.state == "archived", cut
        assert _fresh_values(endpoint, index_mode, thread_id) == expected, cut
        assert _objects(endpoint, f"live/{thread_id}/") == [], cut
        archived = _objects(endpoint, f"archive/{thread_id}/")
        assert status.key in archived, cut
        assert archiver.restore_thread(thread_id).state == "live", cut
        assert _fresh_values(endpoint, index_mode, thread_id) == expected, cut
        restored = _objects(endpoint, f"archive/{thread_id}/")
        if archived != [status.key] or restored:
            left_behind.append((cut, archived, restored))
        for s in (archiver, user):
            s.close()
    writer.close()
    assert left_behind == [], (
        "archive objects left behind: (cut after round trip, archive objects once archived again, "
        f"archive objects once restored): {left_behind}"
    )
