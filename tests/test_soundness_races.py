"""Issue 21, items 3, 4, 8 and 9: an operation on a whole thread (delete_for_runs,
archive_thread) interleaved with another process's write, at every round trip of
the operation in turn (deterministic: the write runs inside the operation's
round trip, see soundness_support.Race). Whatever the interleaving, a write whose
call returned is never lost, and nothing that reads back fails."""

from __future__ import annotations

from typing import Any

from conftest import make_saver
from helpers import checkpoint, config
from soundness_support import RESUME, Race, chain, count_waves, fresh, reset

from s3_saver import (
    MissingObjectError,
    RunDeletedError,
    ThreadArchivedError,
    ThreadDeletedError,
)


def _rows(saver, thread_id: str) -> list[tuple[str, str | None, dict]]:
    """Every checkpoint of the thread, read whole: (id, run_id, values)."""
    return [
        (t.config["configurable"]["checkpoint_id"], t.metadata.get("run_id"), t.checkpoint["channel_values"])
        for t in saver.list(config(thread_id))
    ]


def _read(endpoint: str, mode: str, thread_id: str) -> Any:
    """The thread as a fresh process reads it: its latest and its history; an error's
    type and text when it cannot be read."""
    reader = fresh(endpoint, mode)
    try:
        latest = reader.get_tuple(config(thread_id))
        return (None if latest is None else latest.config["configurable"]["checkpoint_id"]), _rows(reader, thread_id)
    except MissingObjectError as exc:
        return f"MissingObjectError: {exc}"
    finally:
        reader.close()


# -- item 3: delete_for_runs on a run still running -----------------------------------------
def _run_thread(saver, thread_id: str, run_id: str) -> tuple[dict, dict, Any]:
    """A checkpoint of run "base-run", then one of ``run_id`` storing channel "x"; returns
    the first's config, the run's config and the run's next checkpoint (carries "x":
    it reads it from the run's first checkpoint's object)."""
    (base,) = chain(saver, thread_id, [{"counter": 0, "doc": "D"}], run_id="base-run")
    (mid,) = chain(saver, thread_id, [{"counter": 1, "x": "from the run"}], run_id=run_id, parent=base)
    found = saver.get_tuple(mid).checkpoint
    versions = {**found["channel_versions"], "counter": saver.get_next_version(found["channel_versions"]["counter"])}
    late = checkpoint({"counter": 2, "doc": "D", "x": "from the run"}, versions)
    return base, mid, (late, {"counter": versions["counter"]})


def test_item3_delete_for_runs_racing_the_run_s_next_checkpoint(endpoint, index_mode, monkeypatch) -> None:
    """delete_for_runs reads the thread, then marks the run deleted: a checkpoint the
    run commits in between is kept, while the run's earlier checkpoint, whose object
    it reads, is deleted (latest: MissingObjectError), and a second delete_for_runs
    finds nothing to do. Whatever the round trip the run's put comes before, either
    it raises RunDeletedError or it is deleted too; what stays reads."""
    counter = make_saver(endpoint, index_mode)
    counter.setup()
    _run_thread(counter, "twin", "r-twin")
    total = count_waves(lambda: fresh(endpoint, index_mode).delete_for_runs(["r-twin"]), monkeypatch)
    assert total >= 3

    bad = []
    for at in range(total):
        thread_id, run_id = f"t{at}", f"r{at}"
        base, mid, (late, new) = _run_thread(counter, thread_id, run_id)
        deleter, runner = fresh(endpoint, index_mode), fresh(endpoint, index_mode)
        with monkeypatch.context() as patch:
            race = Race(patch, at, lambda: runner.put(mid, late, {"run_id": run_id}, new))
            deleter.delete_for_runs([run_id])
        assert race.fired, at
        if race.raised is not None and not isinstance(race.raised, RunDeletedError):
            raise race.raised
        seen = _read(endpoint, index_mode, thread_id)
        expected = (base["configurable"]["checkpoint_id"], [(base["configurable"]["checkpoint_id"], "base-run", {"counter": 0, "doc": "D"})])
        if seen != expected:
            deleter.delete_for_runs([run_id])  # and a second call: does it repair anything?
            again = _read(endpoint, index_mode, thread_id)
            put = "refused" if race.raised is not None else "committed"
            bad.append((at, race.calls[at] if at < len(race.calls) else None, put, seen, "after a second call:", again))
    assert bad == [], "\n".join(map(repr, bad))


# -- items 8 and 4: a put racing archive_thread -----------------------------------------------
def _ids(configs: list[dict]) -> list[str]:
    return [c["configurable"]["checkpoint_id"] for c in configs]


def _archive_race(endpoint: str, mode: str, monkeypatch, prior: int, racing: int, check) -> list[Any]:
    """For each round trip of archive_thread in turn: a thread of ``prior``
    checkpoints, then archive_thread with another process putting ``racing``
    checkpoints (children of the latest) right before that round trip. ``check``
    (thread id, ids of every checkpoint whose put returned, the archive's outcome)
    returns what is wrong, or None. Returns the wrong cases."""
    writer = make_saver(endpoint, mode)
    writer.setup()
    chain(writer, "twin", [{"counter": i, "doc": "D"} if i == 0 else {"counter": i} for i in range(prior)])
    total = count_waves(lambda: fresh(endpoint, mode).archive_thread("twin"), monkeypatch)
    bad = []
    for at in range(total):
        reset(endpoint, mode)
        thread_id = f"t{at}"
        written = chain(writer, thread_id, [{"counter": i, "doc": "D"} if i == 0 else {"counter": i} for i in range(prior)])
        archiver, racer = fresh(endpoint, mode), fresh(endpoint, mode)
        done: list[dict] = []

        def race() -> None:
            parent = written[-1]
            for i in range(prior, prior + racing):
                (parent,) = chain(racer, thread_id, [{"counter": i}], parent=parent)
                done.append(parent)

        with monkeypatch.context() as patch:
            race_ = Race(patch, at, race)
            try:
                outcome: Any = archiver.archive_thread(thread_id).state
            except ThreadArchivedError as exc:
                outcome = f"ThreadArchivedError: {exc}"
        assert race_.fired, at
        if race_.raised is not None and not isinstance(race_.raised, (ThreadArchivedError, ThreadDeletedError)):
            raise race_.raised
        wrong = check(thread_id, _ids(written) + _ids(done), outcome)
        if wrong is not None:
            bad.append((f"round trip {at} {race_.calls[at]}", f"{len(done)}/{racing} racing puts returned", outcome, wrong))
        for s in (archiver, racer):
            s.close()
    writer.close()
    return bad


def _latest_check(endpoint: str, mode: str):
    def check(thread_id: str, ids: list[str], outcome: Any) -> Any:
        reader = fresh(endpoint, mode)
        try:
            latest = reader.get_tuple(config(thread_id))
        except MissingObjectError as exc:
            return f"latest: MissingObjectError: {exc}"
        seen = None if latest is None else latest.config["configurable"]["checkpoint_id"]
        if seen != ids[-1]:
            return f"latest reads {ids.index(seen) + 1 if seen in ids else seen}-th checkpoint, not the {len(ids)}-th (the last put)"
        return None

    return check


def _nothing_lost_check(endpoint: str, mode: str):
    def check(thread_id: str, ids: list[str], outcome: Any) -> Any:
        reader = fresh(endpoint, mode)
        reader.restore_thread(thread_id)  # a live thread is left as it is
        try:
            listed = [t.config["configurable"]["checkpoint_id"] for t in reader.list(config(thread_id))]
            lost = [i for i, cid in enumerate(ids) if cid not in listed]
            unreadable = [i for i, cid in enumerate(ids) if cid in listed and reader.get_tuple(config(thread_id, "", cid)) is None]
        except MissingObjectError as exc:
            return f"MissingObjectError: {exc}"
        if lost or unreadable:
            return f"{len(lost)} of {len(ids)} committed checkpoints lost (positions {lost[:5]}...), unreadable: {unreadable[:5]}"
        return None

    return check


def test_item8_a_put_between_archive_s_read_and_switch_stays_the_latest(endpoint, index_mode, monkeypatch) -> None:
    """Neither index's commit checks for an archive in progress: a put committed
    between archive_thread's read of the thread and its switch is parked under the
    marker, and readers see the previous turn (the next run forks the committed
    turn off the thread's line). Whatever the round trip the put comes before, once
    archive_thread returns (or raises), latest is the checkpoint whose put returned."""
    bad = _archive_race(endpoint, index_mode, monkeypatch, prior=4, racing=1, check=_latest_check(endpoint, index_mode))
    assert bad == [], "\n".join(map(repr, bad))


def test_item4_manifest_archive_racing_writes_that_seal_loses_nothing(endpoint, monkeypatch) -> None:
    """Manifest: the archive's "segments changed" guard compares with the head it
    cached after its own intent swap, not with the head it read the thread from:
    writes that seal the head (~48 checkpoints) between the read and the switch go
    unnoticed, the archive reports success, and committed checkpoints vanish. Every
    checkpoint whose put returned must read afterwards (after a restore), or the
    archive must raise ThreadArchivedError with nothing lost."""
    bad = _archive_race(endpoint, "manifest", monkeypatch, prior=20, racing=30, check=_nothing_lost_check(endpoint, "manifest"))
    assert bad == [], "\n".join(map(repr, bad))


# -- item 9: a parked last-wins write loses to the archived one --------------------------------
def test_item9_a_resume_write_racing_the_archive_wins_after_restore(endpoint, index_mode, monkeypatch) -> None:
    """A RESUME write (a last-wins slot) for a checkpoint lands while archive_thread
    runs: it is parked, and on restore the archived (older) value wins (DynamoDB's
    restore overwrites the newer item; the manifest keeps both, archived first, and
    reads the first). Whatever the round trip it comes before, once the thread is
    restored its pending writes show the newer value."""
    writer = make_saver(endpoint, index_mode)
    writer.setup()

    def prepare(thread_id: str) -> dict:
        (cfg,) = chain(writer, thread_id, [{"counter": 0, "doc": "D"}])
        writer.put_writes(cfg, [(RESUME, "old")], "task-1", "path")
        return cfg

    prepare("twin")
    total = count_waves(lambda: fresh(endpoint, index_mode).archive_thread("twin"), monkeypatch)
    bad = []
    for at in range(total):
        reset(endpoint, index_mode)
        thread_id = f"t{at}"
        cfg = prepare(thread_id)
        archiver, racer = fresh(endpoint, index_mode), fresh(endpoint, index_mode)
        with monkeypatch.context() as patch:
            race = Race(patch, at, lambda: racer.put_writes(cfg, [(RESUME, "new")], "task-1", "path"))
            try:
                outcome: Any = archiver.archive_thread(thread_id).state
            except ThreadArchivedError as exc:
                outcome = f"ThreadArchivedError: {exc}"
        assert race.fired, at
        if race.raised is not None:
            raise race.raised
        reader = fresh(endpoint, index_mode)
        reader.restore_thread(thread_id)
        try:
            found = reader.get_tuple(cfg)
            writes: Any = "the checkpoint is gone" if found is None else [(t, ch, v) for t, ch, v in found.pending_writes]
        except MissingObjectError as exc:
            writes = f"MissingObjectError: {exc}"
        if writes != [("task-1", RESUME, "new")]:
            bad.append((f"round trip {at} {race.calls[at]}", outcome, writes))
        for s in (archiver, racer, reader):
            s.close()
    assert bad == [], "\n".join(map(repr, bad))


# -- found on the way: a write that restores the thread while the archive cleans up ---------------
def test_extra_a_put_restoring_the_thread_during_archive_cleanup_is_not_deleted(endpoint, index_mode, monkeypatch) -> None:
    """Not in issue 21 as such. After archive_thread's switch, a put restores the
    thread (a write to an archived thread restores it first) and commits; the
    archive then goes on removing "the archived entries and their objects", which
    are now the restored live thread's: the new latest reads objects that were just
    deleted (DynamoDB: MissingObjectError; pending writes and checkpoints vanish).
    Whatever the round trip the put comes before, every checkpoint whose put
    returned reads afterwards (after a restore)."""
    bad = _archive_race(endpoint, index_mode, monkeypatch, prior=4, racing=1, check=_nothing_lost_check(endpoint, index_mode))
    assert bad == [], "\n".join(map(repr, bad))
