"""Issue 21, items 3, 4, 8 and 9: an operation on a whole thread (delete_for_runs,
archive_thread) interleaved with another process's write, at every round trip of
the operation in turn (deterministic: the write runs inside the operation's
round trip, see soundness_support.Race). Whatever the interleaving, a write whose
call returned is never lost, and nothing that reads back fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from conftest import make_saver
from helpers import checkpoint, config, cut_points
from soundness_support import RESUME, Race, chain, count_waves, fresh, mentions, objects, reset
from test_graphs import review_builder

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
    """For each round trip of archive_thread in turn (make test: a sample, ``cut_points``): a thread of ``prior``
    checkpoints, then archive_thread with another process putting ``racing``
    checkpoints (children of the latest) right before that round trip. ``check``
    (thread id, ids of every checkpoint whose put returned, the archive's outcome)
    returns what is wrong, or None. Returns the wrong cases."""
    writer = make_saver(endpoint, mode)
    writer.setup()
    chain(writer, "twin", [{"counter": i, "doc": "D"} if i == 0 else {"counter": i} for i in range(prior)])
    total = count_waves(lambda: fresh(endpoint, mode).archive_thread("twin"), monkeypatch)
    bad = []
    for at in cut_points(total, most=4):
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


# -- issue 33: a delete_thread while a step's put is in flight --------------------------------
def _held(saver, thread_id: str) -> list[Any]:
    """What the thread's index still names (entries a reader follows, and the kept)."""
    held = saver._sync.run(saver._ctx.index.holdings(thread_id))
    return [*held.live, *held.kept]


@pytest.mark.parametrize("deleter_is", ["another process", "the runner"])
def test_issue33_delete_during_a_step_keeps_none_of_the_step_s_writes(endpoint, index_mode, monkeypatch, deleter_is) -> None:
    """LangGraph sends a step's put_writes while that checkpoint's put is under way.
    The put has read the thread; the thread is deleted; the step's writes come (their
    commit is refused by the delete's generation); then the put lands (refused). Neither
    the writes nor the checkpoint is committed into the new generation: after gc, the
    index names nothing of the deleted run and the bucket holds none of its objects."""
    runner = fresh(endpoint, index_mode)
    runner.setup()
    thread_id = f"race-{deleter_is.split()[-1]}"
    base, mid, (late, new) = _run_thread(runner, thread_id, "r-del")
    late_cfg = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": late["id"]}}
    deleter = runner if deleter_is == "the runner" else fresh(endpoint, index_mode)

    def racer() -> None:
        deleter.delete_thread(thread_id)
        runner.put_writes(late_cfg, [("x", "a task's output of the deleted run"), (RESUME, "resume")], "task-1")

    with monkeypatch.context() as patch:
        # Round trip 1 of the put is its commit: it has written its objects and read the thread.
        race = Race(patch, 1, racer)
        with pytest.raises(ThreadDeletedError):
            runner.put(mid, late, {"run_id": "r-del"}, new)
    assert race.fired
    assert isinstance(race.raised, ThreadDeletedError), race.raised
    reader = fresh(endpoint, index_mode)
    # Refused, not left for a collection to find: nothing before gc, nothing after.
    for collect in (False, True):
        if collect:
            reader.collect_garbage([thread_id], older_than=timedelta(0))
        assert _held(reader, thread_id) == []
        left = [k for k in objects(endpoint) if mentions(thread_id, k) and "/live/" in f"/{k}"]
        assert left == []
    assert reader.get_tuple(late_cfg) is None

    # The thread started afresh by the runner: its first step's writes, sent while
    # that checkpoint's put is under way, go with it into the new generation.
    first = checkpoint({"counter": 0}, {"counter": runner.get_next_version(None)})
    first_cfg = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": first["id"]}}
    with monkeypatch.context() as patch:
        race = Race(patch, 1, lambda: runner.put_writes(first_cfg, [("x", "the new run's")], "task-2"))
        runner.put(config(thread_id), first, {"run_id": "r-new"}, dict(first["channel_versions"]))
    assert race.fired and race.raised is None, race.raised
    found = fresh(endpoint, index_mode).get_tuple(config(thread_id))
    assert found.config["configurable"]["checkpoint_id"] == first["id"]
    assert [(w[1], w[2]) for w in found.pending_writes] == [("x", "the new run's")]


def test_issue33_after_the_race_the_same_process_runs_the_id_afresh_and_resumes_it(endpoint, index_mode, monkeypatch) -> None:
    """After a delete raced a step (its writes and its put refused), the runner's next
    run under the id is a new thread, written by the process that still knows the
    deleted generation: it stops at two interrupts, is resumed twice (the resume
    values are pending writes sent as its steps' puts go) and ends as with
    InMemorySaver, read back by this process and by a fresh one."""
    runner = fresh(endpoint, index_mode)
    runner.setup()
    thread_id = "race-then-run"
    _, mid, (late, new) = _run_thread(runner, thread_id, "r-del")
    late_cfg = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": late["id"]}}

    def racer() -> None:
        fresh(endpoint, index_mode).delete_thread(thread_id)
        runner.put_writes(late_cfg, [("x", "a task's output of the deleted run")], "task-1")

    with monkeypatch.context() as patch:
        race = Race(patch, 1, racer)
        with pytest.raises(ThreadDeletedError):
            runner.put(mid, late, {"run_id": "r-del"}, new)
    assert race.fired and isinstance(race.raised, ThreadDeletedError), race.raised

    cfg = {"configurable": {"thread_id": thread_id}}
    ours = review_builder().compile(checkpointer=runner)
    ref = review_builder().compile(checkpointer=InMemorySaver())
    for graph in (ours, ref):
        graph.invoke({"items": ["in"]}, cfg)
        graph.invoke(Command(resume="yes"), cfg)
        graph.invoke(Command(resume="fine"), cfg)
    expected = [s.values for s in ref.get_state_history(cfg)]
    assert expected[0]["items"][-1] == "published"
    for reader in (runner, fresh(endpoint, index_mode)):
        graph = review_builder().compile(checkpointer=reader)
        assert [s.values for s in graph.get_state_history(cfg)] == expected
