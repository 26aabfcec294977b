"""archive_idle bounded per run (issue 35, item 1): activity entries, a cursor, a report.

* requests for ``archive_idle(limit=1)`` do not grow with the threads ever written
  (20 and 200 threads, half of them archived);
* a run cut short by its budget resumes from its cursor, in a new process too;
* a thread written after its entry's day is not archived (its stale entry goes),
  nor one written between the run's look and the archive's mark; a deleted
  thread's entry goes with it;
* threads without entries (written before they existed) are found by the backfill;
* erase_thread leaves no activity entry naming the thread; nor does delete_thread
  one that a restore, an import or a copy gave it;
* a run drops an entry only as it read it (issue 41): a thread restored by a write
  between a run's read of its entry and the drop keeps the entry that write made,
  and a later run archives it; two runs racing a writer leave no idle thread live.

Entries land on the day of the checkpoint's ``ts``, never before the writer's
yesterday: an old history is written under a pinned clock (the process's
``time``), as a process ten days ago would have.
"""

from __future__ import annotations

import threading
import types
from datetime import datetime, timedelta, timezone

import boto3
import pytest

from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config
from s3_saver import IdleReport
from s3_saver._ops import context, idle

DAY = 86400.0


def _put(saver, tid: str, ts: datetime, step: int = 0) -> None:
    parent = saver.get_tuple(config(tid))
    cp = checkpoint({"n": step}, {"n": str(step + 1)})
    cp["ts"] = ts.isoformat()
    saver.put(parent.config if parent else config(tid), cp, {"source": "loop", "step": step}, {"n": str(step + 1)})


def _at(monkeypatch, when: float | None) -> None:
    """Pin the clock of writes (``ctx.now``) and of archive_idle; None: the real one."""
    import time

    clock = time if when is None else types.SimpleNamespace(time=lambda: when)
    monkeypatch.setattr(context, "time", clock)
    monkeypatch.setattr(idle, "time", clock)


def _written_days_ago(saver, monkeypatch, thread_ids, days: int = 10) -> None:
    """One checkpoint on each thread, written (clock and ``ts``) ``days`` ago; the
    clock is then the real one again."""
    now = datetime.now(timezone.utc).timestamp()
    _at(monkeypatch, now - days * DAY)
    for tid in thread_ids:
        _put(saver, tid, datetime.fromtimestamp(now - days * DAY, timezone.utc))
    _at(monkeypatch, None)


def _entries(endpoint: str, index_mode: str, prefix: str = "") -> list[tuple[str, str]]:
    """Every activity entry of ``prefix``, as (day, thread), read straight from the store."""
    if index_mode == "dynamodb":
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        mark = f"{prefix.rstrip('/') + '%2F' if prefix else ''}#active#"
        items = [i for page in table.get_paginator("scan").paginate(TableName=TABLE) for i in page.get("Items", [])]
        return sorted(tuple(i["sk"]["S"].split("!")) for i in items if i["pk"]["S"].startswith(mark))  # type: ignore[misc]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    root = f"{prefix}listing/active/"
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=root)
    # <day>/<thread>/<token>: the (day, thread) of each object.
    return sorted(tuple(o["Key"][len(root) :].split("/")[:2]) for p in pages for o in p.get("Contents", []))  # type: ignore[misc]


def _requests(saver) -> int:
    snap = saver.stats.snapshot()
    saver.stats.reset()
    return sum(snap.requests.values())


def _grown(endpoint: str, index_mode: str, count: int) -> int:
    """Requests of archive_idle(limit=1) over ``count`` threads, the first half archived."""
    saver = make_saver(endpoint, index_mode, prefix=f"n{count}/")
    saver.setup()
    old = datetime.now(timezone.utc) - timedelta(days=2)
    ids = [f"t{i:04d}" for i in range(count)]
    for tid in ids:
        cp = checkpoint({"n": 0}, {"n": "1"})
        cp["ts"] = old.isoformat()
        saver.put(config(tid), cp, {"source": "input", "step": -1}, {"n": "1"})
    for tid in ids[: count // 2]:
        saver.archive_thread(tid)
    saver.stats.reset()
    report = saver.archive_idle(timedelta(days=1), limit=1)
    assert len(report) == 1 and report[0].thread_id == ids[count // 2] and report.more
    requests = _requests(saver)
    saver.close()
    return requests


def test_archive_idle_requests_do_not_grow_with_the_threads(endpoint, index_mode) -> None:
    small, large = _grown(endpoint, index_mode, 20), _grown(endpoint, index_mode, 80)
    assert large <= 1.5 * small, (small, large)


def test_a_run_cut_by_its_budget_resumes_from_its_cursor(endpoint, index_mode, monkeypatch) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_days_ago(saver, monkeypatch, "abcdef")
    for tid in "abc":  # written again today: their entries of ten days ago are stale
        _put(saver, tid, datetime.now(timezone.utc), step=1)
    first = saver.archive_idle(timedelta(days=5), budget=2)
    assert isinstance(first, IdleReport) and first == [] and first.more
    assert (first.examined, first.dropped) == (2, 2)
    # Another process (a Lambda's next invocation) goes on where that run stopped.
    other = make_saver(endpoint, index_mode)
    other.stats.reset()
    second = other.archive_idle(timedelta(days=5), budget=2)
    assert [s.thread_id for s in second] == ["d"] and second.examined == 2 and second.more
    third = other.archive_idle(timedelta(days=5), budget=10)
    assert [s.thread_id for s in third] == ["e", "f"] and not third.more
    assert {t.thread_id: t.archived for t in other.list_threads()} == dict.fromkeys("abc") | dict.fromkeys(
        "def", "GLACIER_IR"
    )
    # What is left: the entries of today's writes, nothing behind the cursor.
    assert [t for _, t in _entries(endpoint, index_mode)] == ["a", "b", "c"]
    assert other.archive_idle(timedelta(days=5)) == [] and other.archive_idle(timedelta(days=5)).examined == 0
    saver.close()
    other.close()


def test_a_thread_written_after_its_entry_or_the_look_is_not_archived(endpoint, index_mode, monkeypatch) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_days_ago(saver, monkeypatch, ("later", "raced", "deleted"))
    _put(saver, "later", datetime.now(timezone.utc), step=1)
    saver.delete_thread("deleted")  # its entry goes with it
    assert "deleted" not in {t for _, t in _entries(endpoint, index_mode)}
    # "raced" is written (by another process) between the run's look, which saw
    # it old, and the archive's mark.
    look, writer = idle._latest_ts, make_saver(endpoint, index_mode)

    def stale_look(ctx, thread_ids):
        found = yield from look(ctx, thread_ids)
        _put(writer, "raced", datetime.now(timezone.utc), step=1)
        return found

    monkeypatch.setattr(idle, "_latest_ts", stale_look)
    report = saver.archive_idle(timedelta(days=5))
    assert report == [] and (report.examined, report.dropped) == (2, 1)
    # Left: the entry of "later"'s write today, and "raced"'s: the next run decides on it.
    assert sorted(t for _, t in _entries(endpoint, index_mode)) == ["later", "raced", "raced"]
    assert {t.thread_id: t.archived for t in saver.list_threads()} == {"later": None, "raced": None}
    assert saver.get_tuple(config("raced")).checkpoint["channel_values"] == {"n": 1}
    saver.close()
    writer.close()


def test_the_backfill_gives_threads_without_entries_one(endpoint, index_mode, monkeypatch) -> None:
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_days_ago(saver, monkeypatch, ("x", "y", "z"))
    _drop_every_entry(endpoint, index_mode)  # as written before entries existed
    assert saver.archive_idle(timedelta(days=5)) == []
    first = saver.archive_idle(timedelta(days=5), backfill=True, budget=2)
    assert (first.backfilled, first.backfill_more) == (2, True) and len(first) == 2
    second = saver.archive_idle(timedelta(days=5), backfill=True, budget=2)
    assert (second.backfilled, second.backfill_more) == (1, False) and len(second) == 1
    assert {t.archived for t in saver.list_threads()} == {"GLACIER_IR"}
    done = saver.archive_idle(timedelta(days=5), backfill=True)
    assert (done.backfilled, done.backfill_more, done) == (0, False, [])
    saver.close()


def _drop_every_entry(endpoint: str, index_mode: str) -> None:
    if index_mode == "dynamodb":
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        for page in table.get_paginator("scan").paginate(TableName=TABLE):
            for item in page.get("Items", []):
                if "#active#" in item["pk"]["S"]:
                    table.delete_item(TableName=TABLE, Key={"pk": item["pk"], "sk": item["sk"]})
        return
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="listing/active/"):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=o["Key"])


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_erase_leaves_no_activity_entry(endpoint, index_mode, monkeypatch, versioned) -> None:
    from conftest import make_versioned

    if versioned:
        make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_days_ago(saver, monkeypatch, ("gone", "kept"))
    _put(saver, "gone", datetime.now(timezone.utc), step=1)
    assert {t for _, t in _entries(endpoint, index_mode)} == {"gone", "kept"}
    report = saver.erase_thread("gone")
    assert report.complete, report.remaining
    assert {t for _, t in _entries(endpoint, index_mode)} == {"kept"}
    if versioned and index_mode == "manifest":
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        left = s3.list_object_versions(Bucket=BUCKET, Prefix="listing/active/")
        assert _named_by(endpoint, index_mode, "gone") == []
    saver.close()


def _named_by(endpoint: str, index_mode: str, thread_id: str) -> list[str]:
    """The activity entries naming ``thread_id`` that an erase must remove: a
    table's items, or a bucket's objects with every version and delete marker."""
    if index_mode == "dynamodb":
        return [f"{day}/{t}" for day, t in _entries(endpoint, index_mode) if t == thread_id]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix="listing/active/")
    found = [v["Key"] for p in pages for v in p.get("Versions", []) + p.get("DeleteMarkers", [])]
    return [k for k in found if k[len("listing/active/") :].split("/")[1] == thread_id]


def _written_on(saver, monkeypatch, tid: str, days_ago: int, step: int) -> None:
    now = datetime.now(timezone.utc).timestamp()
    _at(monkeypatch, now - days_ago * DAY)
    _put(saver, tid, datetime.fromtimestamp(now - days_ago * DAY, timezone.utc), step=step)
    _at(monkeypatch, None)


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_erase_removes_the_activity_entries_of_a_thread_s_earlier_lives(endpoint, index_mode, monkeypatch, versioned) -> None:
    """A thread written on two days, deleted (the delete removes its latest day's
    entry; the older one waits for the walk), then started afresh today: the erase
    removes the older life's entry too, though the new life was listed today."""
    from conftest import make_versioned

    if versioned:
        make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_on(saver, monkeypatch, "again", 10, step=0)
    _written_on(saver, monkeypatch, "again", 9, step=1)
    saver.delete_thread("again")
    _put(saver, "again", datetime.now(timezone.utc), step=0)
    _written_days_ago(saver, monkeypatch, ("kept",))
    assert saver.erase_thread("again").complete
    assert _named_by(endpoint, index_mode, "again") == []
    assert {t for _, t in _entries(endpoint, index_mode)} == {"kept"}
    saver.close()


def test_erase_removes_the_versions_of_entries_the_walk_dropped(endpoint, index_mode, monkeypatch) -> None:
    """On a versioned bucket, the walk's drop of a stale entry (a plain delete) keeps
    it as a noncurrent version behind a delete marker, and the walk's cursor moves
    past its day: the erase still finds it."""
    from conftest import make_versioned

    make_versioned(endpoint)
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_on(saver, monkeypatch, "gone", 10, step=0)
    _written_on(saver, monkeypatch, "other", 9, step=0)
    _put(saver, "gone", datetime.now(timezone.utc), step=1)
    _put(saver, "other", datetime.now(timezone.utc), step=1)
    walked = saver.archive_idle(timedelta(days=5))
    assert (walked.examined, walked.dropped, walked) == (2, 2, [])
    assert saver.erase_thread("gone").complete
    assert _named_by(endpoint, index_mode, "gone") == []
    assert {t for _, t in _entries(endpoint, index_mode)} == {"other"}
    saver.close()


def _archived(saver) -> dict[str, str | None]:
    return {t.thread_id: t.archived for t in saver.list_threads()}


@pytest.mark.parametrize("where", ["after the archive", "inside the archive"])
def test_a_thread_restored_by_a_write_while_a_run_archives_it_stays_found(endpoint, index_mode, monkeypatch, where) -> None:
    """Run R reads thread x's entry and archives x. Before R drops the entry (at
    the end of its chunk: ``after the archive``; or before the archive's own
    cleanup drops the one the record names: ``inside the archive``, right after
    the switch), a process that wrote x today writes it again: it restores x,
    writes the day's entry anew, and, remembering it wrote x's entry today,
    writes no other. R's drops must leave that entry: a later run finds x idle."""
    _restored_while_archived(
        lambda: make_saver(endpoint, index_mode), lambda: [t for _, t in _entries(endpoint, index_mode)], monkeypatch, where
    )


def test_a_thread_restored_by_a_write_while_a_run_archives_it_stays_found_on_seaweedfs(seaweedfs_bucket, monkeypatch) -> None:
    """The same on a real S3 server (manifest mode): the entries' keys, listed and deleted there."""
    from conftest import seaweedfs_client, seaweedfs_saver

    endpoint, bucket = seaweedfs_bucket

    def listed() -> list[str]:
        pages = seaweedfs_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="listing/active/")
        return sorted(o["Key"].split("/")[3] for p in pages for o in p.get("Contents", []))

    _restored_while_archived(lambda: seaweedfs_saver(endpoint, bucket), listed, monkeypatch, "after the archive")


def _restored_while_archived(make, listed, monkeypatch, where: str) -> None:
    """``make``: a saver of a new process; ``listed``: the threads the entries name."""
    writer = make()
    writer.setup()
    _put(writer, "x", datetime.now(timezone.utc))  # its entry of today, remembered by this process
    real = idle.archive_thread
    written = []

    def write_again() -> None:
        _put(writer, "x", datetime.now(timezone.utc), step=1)  # restores x first
        written.append(where)

    def racing_archive(ctx, thread_id, storage_class, still=None):
        switch = ctx.index.switch_archive

        def switched(*args):
            done = yield from switch(*args)
            if where == "inside the archive":
                write_again()
            return done

        monkeypatch.setattr(ctx.index, "switch_archive", switched)
        status = yield from real(ctx, thread_id, storage_class, still)
        if where == "after the archive":
            write_again()
        return status

    monkeypatch.setattr(idle, "archive_thread", racing_archive)
    runner = make()
    raced = runner.archive_idle(timedelta(0))
    assert [s.thread_id for s in raced] == ["x"] and written == [where]
    assert _archived(runner) == {"x": None}  # restored by the write
    assert listed() == ["x"]
    monkeypatch.setattr(idle, "archive_thread", real)
    later = make()
    assert [s.thread_id for s in later.archive_idle(timedelta(0))] == ["x"]
    assert _archived(later) == {"x": "GLACIER_IR"} and listed() == []
    assert later.get_tuple(config("x")).checkpoint["channel_values"] == {"n": 1}
    for s in (writer, runner, later):
        s.close()


def test_two_runs_racing_a_writer_leave_no_idle_thread_live(endpoint, index_mode) -> None:
    """Two archive_idle runs at once, and a process writing the threads again as
    they go (each write to an archived thread restores it, and writes the day's
    entry anew once the runs dropped theirs); then runs until one has nothing
    to do: every thread, idle by then, ends archived."""
    threads = [f"t{i:02d}" for i in range(8)]
    writer = make_saver(endpoint, index_mode)
    writer.setup()
    for tid in threads:
        _put(writer, tid, datetime.now(timezone.utc))
    runs = [make_saver(endpoint, index_mode) for _ in range(2)]
    running = threading.Event()
    running.set()
    failures: list[Exception] = []

    def run(saver) -> None:
        try:
            saver.archive_idle(timedelta(0))
        except Exception as exc:  # reported below
            failures.append(exc)

    def write() -> None:
        step = 1
        try:
            while running.is_set():
                for tid in threads:
                    _put(writer, tid, datetime.now(timezone.utc), step=step)
                step += 1
        except Exception as exc:  # reported below
            failures.append(exc)

    workers = [threading.Thread(target=run, args=(s,)) for s in runs]
    pen = threading.Thread(target=write)
    pen.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    running.clear()
    pen.join()
    assert not failures, failures
    later = make_saver(endpoint, index_mode)
    for _ in range(6):
        report = later.archive_idle(timedelta(0))
        if not report and not report.more:
            break
    assert _archived(later) == dict.fromkeys(threads, "GLACIER_IR")
    for s in (writer, later, *runs):
        s.close()


def test_delete_and_archive_remove_the_entries_every_writer_of_the_day_made(endpoint, index_mode) -> None:
    """Three processes write a thread on one day, each its own entry (the manifest:
    a key each; a table: one item, each write replacing its token): an archive
    removes them all, and so does a delete of the thread restored by a write."""
    writers = [make_saver(endpoint, index_mode) for _ in range(3)]
    writers[0].setup()
    for step, w in enumerate(writers):
        _put(w, "t", datetime.now(timezone.utc), step=step)
    assert {t for _, t in _entries(endpoint, index_mode)} == {"t"}
    writers[0].archive_thread("t")
    assert _entries(endpoint, index_mode) == []
    fresh = make_saver(endpoint, index_mode)  # a process with nothing cached: the write restores
    _put(fresh, "t", datetime.now(timezone.utc), step=3)
    _put(writers[1], "t", datetime.now(timezone.utc), step=4)
    writers[2].delete_thread("t")
    # The restore's entry is recorded by its switch, as a write's by its commit: the delete removes it too.
    assert _entries(endpoint, index_mode) == []
    report = fresh.archive_idle(timedelta(0))
    assert (report, report.dropped, _entries(endpoint, index_mode)) == ([], 0, [])
    for s in (*writers, fresh):
        s.close()


def _naming(endpoint: str, index_mode: str, thread_id: str) -> list[str]:
    """Every object of the bucket and item of the table whose key names ``thread_id``."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    found = [o["Key"] for p in pages for o in p.get("Contents", []) if thread_id in o["Key"]]
    if index_mode == "dynamodb":
        table = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
        items = [i for page in table.get_paginator("scan").paginate(TableName=TABLE) for i in page.get("Items", [])]
        found += [f"item {i['pk']['S']} {i['sk']['S']}" for i in items if thread_id in i["pk"]["S"] + i["sk"]["S"]]
    return sorted(found)


def _grown_with_runs(saver, thread_id: str) -> None:
    """Three checkpoints of two runs (each run leaves a hint naming the thread)."""
    stored = config(thread_id)
    for step, run in enumerate(("run-a", "run-a", "run-b")):
        cp = checkpoint({"n": step}, {"n": str(step + 1)})
        cp["ts"] = datetime.now(timezone.utc).isoformat()
        stored = saver.put(stored, cp, {"source": "loop", "step": step, "run_id": run}, {"n": str(step + 1)})


@pytest.mark.parametrize("how", ["restore", "import", "copy"])
def test_a_delete_leaves_nothing_of_a_restored_imported_or_copied_thread(endpoint, index_mode, how) -> None:
    """restore_thread, import_thread and copy_thread each give the thread its
    activity entry of the day, which the thread's record names (as a write's
    commit names its own): delete_thread then removes it with the listing and
    the run hints. What stays is the thread's small record (a table's item, the
    manifest's head); nothing else names the thread. Before, the entry was
    written beside the commit and named by nothing: every delete left it."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    subject = "subject-thread"
    if how == "restore":
        _grown_with_runs(saver, subject)
        saver.archive_thread(subject)
        assert make_saver(endpoint, index_mode).restore_thread(subject).state == "live"
    elif how == "import":
        _grown_with_runs(saver, "origin")
        assert saver.import_thread(saver.export_thread("origin"), thread_id=subject) == subject
    else:
        _grown_with_runs(saver, "origin")
        saver.copy_thread("origin", subject)
    assert subject in {t for _, t in _entries(endpoint, index_mode)}
    make_saver(endpoint, index_mode).delete_thread(subject)
    record = [f"manifests/{subject}/head"] if index_mode == "manifest" else [f"item {subject}  tombstone"]
    assert _naming(endpoint, index_mode, subject) == record
    assert saver.get_tuple(config(subject)) is None
    saver.close()


def test_erase_keeps_the_entry_of_a_life_started_during_it(endpoint, index_mode, monkeypatch) -> None:
    """A run starts the thread afresh right after the erase's delete: the erase
    removes what the earlier life left, and the new life's activity entry, which
    its process will not write again that day, stays: a later run archives it."""
    from s3_saver._ops import delete

    saver = make_saver(endpoint, index_mode)
    saver.setup()
    _written_days_ago(saver, monkeypatch, ("again",), days=3)
    _put(saver, "again", datetime.now(timezone.utc), step=1)
    writer = make_saver(endpoint, index_mode)
    real = delete.delete_thread

    def then_afresh(ctx, thread_id, *rest):
        yield from real(ctx, thread_id, *rest)
        cp = checkpoint({"n": 0}, {"n": "1"})
        writer.put(config(thread_id), cp, {"source": "input", "step": -1}, {"n": "1"})

    monkeypatch.setattr(delete, "delete_thread", then_afresh)
    saver.erase_thread("again")
    monkeypatch.setattr(delete, "delete_thread", real)
    # The earlier life's two entries (three days ago, today) are gone; the new life's stays.
    assert [t for _, t in _entries(endpoint, index_mode)] == ["again"]
    later = make_saver(endpoint, index_mode)
    assert [s.thread_id for s in later.archive_idle(timedelta(0))] == ["again"]
    for s in (saver, writer, later):
        s.close()


def test_activity_keys_parse_exactly() -> None:
    """An entry's key names its day, thread and token (none: an earlier version's
    key); a key this layout does not build (another saver's, nested under the
    folder) is no entry."""
    from s3_saver._format.keys import KeyLayout, new_token

    layout = KeyLayout("p")
    token = new_token(8)
    for thread_id in ("a", "a/b", "%2F", "", "日本", "x" * 40):
        for tok in ("", token):
            key = layout.activity_key(20261127, thread_id, tok)
            assert layout.parse_activity_key(key) == (20261127, thread_id, tok)
    folder = layout.activity_key(20261127, "a")
    for key in (folder + "/live/t/x", folder + "/" + token.upper(), folder + "/", "p/listing/active/2026112/a", folder[2:]):
        assert layout.parse_activity_key(key) is None, key
