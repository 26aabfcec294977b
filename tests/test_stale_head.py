"""Two processes, each with its own cache of a thread's index: what one cached
before the other changed the thread never refuses a call (issue 32, item 4).

Process B archives a thread, process A writes to it (which restores it). B's
manifest head cache still says archived: a refusal decided on it must be decided
again on the head as it is now. The DynamoDB mode reads its record each time and
runs the same sequences as the reference.
"""

from __future__ import annotations

from typing import Any

from conftest import make_saver
from helpers import checkpoint, config
from s3_saver import S3Saver
from s3_saver._format.entries import WritesEntry
from s3_saver._format.keys import new_token


def _pair(endpoint: str, index_mode: str) -> tuple[S3Saver, S3Saver]:
    """Two savers on one store: two processes, each with caches of its own."""
    a = make_saver(endpoint, index_mode)
    a.setup()
    return a, make_saver(endpoint, index_mode)


def _thread(saver: S3Saver, thread_id: str, runs: list[str]) -> dict[str, Any]:
    """One checkpoint per run, each the child of the one before."""
    cfg = config(thread_id)
    for step, run in enumerate(runs):
        cfg = saver.put(cfg, checkpoint({"n": step}, {"n": step + 1}), {"run_id": run, "step": step}, {"n": step + 1})
    return cfg


def _archived_by_b_restored_by_a(a: S3Saver, b: S3Saver, thread_id: str, last: dict[str, Any]) -> dict[str, Any]:
    """B archives the thread (its cache: archived); A writes to it, which restores it."""
    assert b.archive_thread(thread_id).state == "archived"
    return a.put(last, checkpoint({"n": 9}, {"n": 10}), {"run_id": "a-late", "step": 9}, {"n": 10})


def _runs(saver: S3Saver, thread_id: str) -> list[str]:
    return [c.metadata["run_id"] for c in saver.list(config(thread_id))]


def test_delete_for_runs_after_another_process_restored_the_thread(endpoint, index_mode) -> None:
    a, b = _pair(endpoint, index_mode)
    last = _thread(a, "t", ["r1", "r2"])
    _archived_by_b_restored_by_a(a, b, "t", last)
    b.delete_for_runs(["r2"])
    assert _runs(b, "t") == ["a-late", "r1"]
    b.delete_for_runs(["r1"])  # and again: nothing in between made B read the head
    assert _runs(a, "t") == ["a-late"]
    a.close()
    b.close()


def test_delete_for_runs_over_threads_one_of_them_stale(endpoint, index_mode) -> None:
    """The gather over threads does not stop at the thread B holds stale."""
    a, b = _pair(endpoint, index_mode)
    lasts = {t: _thread(a, t, ["keep", "gone"]) for t in ("t1", "t2", "t3")}
    _archived_by_b_restored_by_a(a, b, "t2", lasts["t2"])
    b.delete_for_runs(["gone"])
    assert {t: _runs(a, t) for t in lasts} == {"t1": ["keep"], "t2": ["a-late", "keep"], "t3": ["keep"]}
    a.close()
    b.close()


def test_archive_mark_on_a_stale_cache_is_decided_on_the_head(endpoint, index_mode) -> None:
    """archive_thread's mark, when the head B holds says archived and A restored it
    since (archive_thread reads the head before it marks: the index call itself)."""
    a, b = _pair(endpoint, index_mode)
    last = _thread(a, "t", ["r1"])
    _archived_by_b_restored_by_a(a, b, "t", last)
    key = b._ctx.layout.archive_key("t", new_token(20))
    b._sync.run(b._ctx.index.mark_archive("t", key))  # refused today: "it is archived"
    b._sync.run(b._ctx.index.cancel_archiving("t", key))
    assert b.archive_thread("t").state == "archived"  # and a whole archive from B goes through
    assert _runs(a, "t") == ["a-late", "r1"]
    a.close()
    b.close()


def test_writes_after_another_process_restored_cost_a_head_read(endpoint, index_mode) -> None:
    """B's put_writes and put need no restore (no archive read): at most one
    more read than warm ones, and the design's two round trips."""
    a, b = _pair(endpoint, index_mode)
    last = _thread(a, "t", ["r1"])
    restored = _archived_by_b_restored_by_a(a, b, "t", last)
    b.stats.reset()
    b.put_writes(restored, [("n", 5)], "task-b")
    snap = b.stats.snapshot()
    assert snap.round_trips <= 2, snap
    assert snap.requests[("s3", "get_object")] <= (1 if index_mode == "manifest" else 0), snap
    b.stats.reset()
    b.put(restored, checkpoint({"n": 10}, {"n": 11}), {"run_id": "b", "step": 10}, {"n": 11})
    snap = b.stats.snapshot()
    assert snap.round_trips <= 2, snap
    assert _runs(a, "t") == ["b", "a-late", "r1"]
    assert b.get_tuple(restored).pending_writes == [("task-b", "n", 5)]
    a.close()
    b.close()


def test_commit_fenced_on_a_stale_cache_is_decided_on_the_head(endpoint, index_mode) -> None:
    """The commit's fence itself, on the head B holds (archived) after A restored:
    the index commit (a put reads a head it holds archived before it commits)."""
    a, b = _pair(endpoint, index_mode)
    last = _thread(a, "t", ["r1"])
    _archived_by_b_restored_by_a(a, b, "t", last)
    cp_id = last["configurable"]["checkpoint_id"]
    entry = WritesEntry("t", "", cp_id, "task-b", "r1", new_token(), gen=0)
    b._sync.run(b._ctx.index.commit_writes([entry]))  # Fenced today: "archived"
    found = b._sync.run(b._ctx.index.get("t", "", cp_id))
    assert [w.task_id for w in b._sync.run(b._ctx.index.writes(found))] == ["task-b"]
    a.close()
    b.close()


def test_delete_for_runs_after_another_process_restored_on_seaweedfs(seaweedfs_bucket) -> None:
    from conftest import seaweedfs_saver

    endpoint, bucket = seaweedfs_bucket
    a = seaweedfs_saver(endpoint, bucket)
    a.setup()
    b = seaweedfs_saver(endpoint, bucket)
    last = _thread(a, "t", ["r1", "r2"])
    _archived_by_b_restored_by_a(a, b, "t", last)
    b.delete_for_runs(["r2"])
    assert _runs(a, "t") == ["a-late", "r1"]
    a.close()
    b.close()
