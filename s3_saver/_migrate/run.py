"""migrate: copy every thread of one LangGraph checkpoint saver into another, resumably, and verify.

The saver API does the copying (``list``, ``put``, ``put_writes``), so any
``BaseCheckpointSaver`` can be the source or the target: SqliteSaver, PostgresSaver,
InMemorySaver, S3Saver in either index mode. A thread is read whole (every
namespace), copied parents first, then compared with what the target reads back
(`verify`). Only finding a SqliteSaver's or a
PostgresSaver's threads goes around it: one query of their ``checkpoints`` table.

Threads may be copied several at once (``workers``); one thread's checkpoints
always go in order, on one worker.

Resumable: whatever a run was doing when it stopped (a kill between a ``put`` and
its ``put_writes``, mid-thread, mid-namespace, other workers mid-thread), running
it again skips the checkpoints the target holds, sends the pending writes the
target lacks, and copies the rest; nothing is stored twice.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from langgraph.checkpoint.base import BaseCheckpointSaver

from s3_saver._migrate.copy import (
    Step,
    by_namespace,
    copy_checkpoint,
    parents_first,
    task_counts,
    whole_thread,
)
from s3_saver._migrate.urls import refuse_same_store
from s3_saver._migrate.verify import (
    checkpoint_id_of,
    namespace_of,
    parent_id_of,
    verify_thread,
)
from s3_saver._saver.saver import S3Saver
from s3_saver.errors import ConfigurationError


@dataclass
class MigrationReport:
    """What [migrate()][s3_saver.migrate] did.

    Attributes:
        threads: Threads of which something was copied by this run.
        checkpoints: Checkpoints copied by this run.
        writes: Pending writes sent by this run (for a checkpoint the target
            already held, those of the tasks it held fewer writes of).
        skipped: Checkpoints the target already held (a resumed run).
        bytes: Serialized bytes copied: checkpoints, metadata and pending
            writes, as the source's serializer (``dumps_typed``) writes them.
        verified: Checkpoints compared equal afterwards (0 with ``verify=False``).
        seconds: Wall time of the whole call.
    """

    threads: int = 0
    checkpoints: int = 0
    writes: int = 0
    skipped: int = 0
    bytes: int = 0
    verified: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class MigrationProgress:
    """Passed to ``on_progress`` after each checkpoint (copied or skipped).

    Attributes:
        thread_id: The thread of the checkpoint just done (with several
            workers, successive calls may name different threads).
        done: Checkpoints done so far in this call, copied and skipped, by
            every worker: one more at each call.
        total: Checkpoints to do in all, when known (a SqliteSaver's or a
            PostgresSaver's threads counted in its table, another non-S3Saver
            source listed whole); None otherwise.
        bytes: Serialized bytes copied so far.
    """

    thread_id: str
    done: int
    total: int | None
    bytes: int


def migrate(
    source: BaseCheckpointSaver,
    target: BaseCheckpointSaver,
    *,
    thread_ids: Sequence[str] | None = None,
    verify: bool = True,
    on_progress: Callable[[MigrationProgress], None] | None = None,
    workers: int = 1,
) -> MigrationReport:
    """Copy threads from one checkpoint saver into another, keeping everything a graph reads.

    Every namespace, checkpoint and pending write of each thread is copied with
    its ids, parent, metadata, channel values and versions. Checkpoints go in
    parent before child; each ``put`` names its parent and, as ``new_versions``,
    the channels whose version differs from the parent's, so savers that store
    a (channel, version) once (S3Saver, PostgresSaver) do so here too.

    Threads: ``thread_ids``, or every thread of the source: from
    ``list_threads()`` for an S3Saver (a thread whose checkpoints are all in
    subgraph namespaces is not in its listing: name it in ``thread_ids``), from
    one ``GROUP BY thread_id`` query of the ``checkpoints`` table for a
    SqliteSaver or a PostgresSaver, from ``list(None)`` for other savers.

    Args:
        source: The saver read from.
        target: The saver written to (its tables, bucket or index must exist).
        thread_ids: Only these threads (each must have checkpoints in the source).
        verify: Afterwards, read each thread back from the target and compare it
            with the source: same checkpoint ids in the same order, parents,
            metadata, checkpoints and pending writes, values with their types
            (``1`` and ``1.0`` differ; objects of one type compare with ``==``).
        on_progress: Called after each checkpoint, one call at a time even with
            several workers (``done`` counts up by one); an exception it raises
            stops the migration (a later run resumes it).
        workers: Threads copied at once, each on a thread of a pool. Above 1 both
            savers are used from several threads: S3Saver, PostgresSaver and a
            SqliteSaver over a ``check_same_thread=False`` connection allow it
            (the last two take turns on their connection); other savers must
            too. Each worker holds one thread's checkpoints in memory.

    Returns:
        What was copied, skipped and verified.

    Raises:
        MigrationError: The target differs from the source (verification), or
            stored a checkpoint under another id.
        ConfigurationError: ``thread_ids`` is a string, or names a thread the
            source does not have; ``workers`` is not a positive integer.
        ThreadArchivedError: An S3Saver source's thread is archived in a cold
            storage class: ``restore_thread`` it first.

    An error on one worker stops the others after the checkpoint each is
    copying (no other thread is started) and is raised once they have.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers must be a positive integer, got {workers!r}")
    refuse_same_store(source, target)
    started = time.perf_counter()
    threads, total = _threads(source, thread_ids)
    run = _Run(source, target, verify, on_progress, total)
    if min(workers, len(threads)) <= 1:
        for thread_id in threads:  # no pool: any saver works
            run.thread(thread_id)
    else:
        run.in_parallel(threads, min(workers, len(threads)))
    run.report.seconds = time.perf_counter() - started
    return run.report


class _Run:
    """One call's state. Workers share the report, the progress count and the stop flag
    (under ``lock``); each thread is read, copied and verified by one worker."""

    def __init__(
        self,
        source: BaseCheckpointSaver,
        target: BaseCheckpointSaver,
        verify: bool,
        on_progress: Callable[[MigrationProgress], None] | None,
        total: int | None,
    ) -> None:
        self.source, self.target, self.verify = source, target, verify
        self.on_progress, self.total = on_progress, total
        self.serde = source.serde
        self.report = MigrationReport()
        self.done = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def thread(self, thread_id: str) -> None:
        """Copy one thread, namespace by namespace, then verify it."""
        # Its namespaces in the source's listed order; listings are read whole (by_namespace).
        source_ns = by_namespace(self.source.list(whole_thread(thread_id)))
        held = self.target.list(whole_thread(thread_id))
        present = {(namespace_of(t), checkpoint_id_of(t)): task_counts(t) for t in held}
        copied = False
        for ns in sorted(source_ns, key=lambda n: (n != "", n)):  # the root first: it lists the thread
            by_id = {checkpoint_id_of(t): t for t in source_ns[ns]}
            for tup in parents_first(thread_id, ns, by_id):
                if self.stop.is_set():  # another worker failed: stop between checkpoints
                    return
                parent = by_id.get(parent_id_of(tup) or "")
                step = copy_checkpoint(self.serde, self.target, thread_id, ns, tup, parent, present)
                copied = copied or bool(step.checkpoints or step.writes)
                self._count(thread_id, step)
        verified = 0
        if self.verify:
            target_ns = by_namespace(self.target.list(whole_thread(thread_id)))
            verified = verify_thread(self.serde, thread_id, source_ns, target_ns)
        with self.lock:
            self.report.threads += copied
            self.report.verified += verified

    def _count(self, thread_id: str, step: Step) -> None:
        with self.lock:
            report = self.report
            report.checkpoints += step.checkpoints
            report.skipped += step.skipped
            report.writes += step.writes
            report.bytes += step.bytes
            self.done += 1
            # Under the lock: calls one at a time, ``done`` in order, whichever worker.
            if self.on_progress is not None and not self.stop.is_set():
                self.on_progress(MigrationProgress(thread_id, self.done, self.total, report.bytes))

    def in_parallel(self, threads: list[str], workers: int) -> None:
        """Run ``workers`` workers, each taking the next thread until none is left or one fails."""
        pending: Iterator[str] = iter(threads)
        errors: list[BaseException] = []

        def work() -> None:
            while not self.stop.is_set():
                with self.lock:
                    thread_id = next(pending, None)
                if thread_id is None:
                    return
                try:
                    self.thread(thread_id)
                except BaseException as exc:  # noqa: BLE001 (raised by the caller's thread below)
                    with self.lock:
                        errors.append(exc)
                    self.stop.set()
                    return

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-saver-migrate") as pool:
            futures = [pool.submit(work) for _ in range(workers)]
            try:
                wait(futures)
            except BaseException:  # e.g. KeyboardInterrupt: the workers end their checkpoint, then stop
                self.stop.set()
                raise
        if errors:
            first = errors[0]
            if len(errors) > 1:
                first.add_note(f"{len(errors) - 1} other worker(s) failed too, first with {errors[1]!r}")
            raise first


# -- which threads -------------------------------------------------------------------------
def _threads(source: BaseCheckpointSaver, thread_ids: Sequence[str] | None) -> tuple[list[str], int | None]:
    """The threads to copy, and how many checkpoints they hold when that is known."""
    if thread_ids is not None:
        if isinstance(thread_ids, (str, bytes)):
            raise ConfigurationError(f"thread_ids must be a list of thread ids, not a string: {thread_ids!r}")
        wanted = list(dict.fromkeys(thread_ids))
        for thread_id in wanted:
            # Read to the end (one tuple): a SqliteSaver's open listing would hold its lock.
            if not list(source.list(whole_thread(thread_id), limit=1)):
                raise ConfigurationError(f"thread {thread_id!r} has no checkpoints in the source; nothing was copied")
        return wanted, None
    if isinstance(source, S3Saver):
        # The thread listing: never a scan of the bucket or the table.
        return [info.thread_id for info in source.list_threads()], None
    counted = _count_in_table(source)
    if counted is None:  # any other saver: read it all once
        counts: Counter[str] = Counter(str(t.config["configurable"]["thread_id"]) for t in source.list(None))
        counted = list(counts.items())
    return [thread_id for thread_id, _ in counted], sum(n for _, n in counted)


# Each thread with its checkpoints, in the order list(None) meets them (newest checkpoint id first).
_COUNT_SQL = "SELECT thread_id, COUNT(*) AS n FROM checkpoints GROUP BY thread_id ORDER BY MAX(checkpoint_id) DESC"


def _count_in_table(source: BaseCheckpointSaver) -> list[tuple[str, int]] | None:
    """(thread id, checkpoints) of a SqliteSaver's or a PostgresSaver's threads from one
    query under the saver's lock, rather than every checkpoint deserialized; None for other
    savers (and subclasses that list otherwise). Their modules are looked up, not imported:
    a source of theirs has imported them."""
    sqlite = getattr(sys.modules.get("langgraph.checkpoint.sqlite"), "SqliteSaver", None)
    if sqlite is not None and isinstance(source, sqlite) and type(source).list is sqlite.list:
        with source.cursor(transaction=False) as cur:  # self.lock, around one connection
            cur.execute(_COUNT_SQL)
            return [(str(thread_id), int(n)) for thread_id, n in cur.fetchall()]
    postgres = getattr(sys.modules.get("langgraph.checkpoint.postgres"), "PostgresSaver", None)
    if postgres is not None and isinstance(source, postgres) and type(source).list is postgres.list:
        with source._cursor() as cur:  # self.lock, and a connection of the pool when it is one
            cur.execute(_COUNT_SQL)
            return [(str(row["thread_id"]), int(row["n"])) for row in cur.fetchall()]
    return None
