"""The memory index in the bucket (manifest mode): group commit of one process's
concurrent swaps of one head.

Puts of one process into one namespace at the same time (threads, or asyncio tasks:
LangGraph's ``aput`` from many nodes) would each swap the namespace's head on the ETag
the process holds: one wins, every other one reads the head back and swaps again
(412, GET, PUT: n² requests for n puts, and a burst of hundreds runs out of retries).
Here they queue per head (the thread manifest's ``GroupCommit``): the first leads a
swap, and those that come meanwhile go, in the order they came, in the next one, so a
process never conflicts with itself. So do its registrations of new namespaces (one
registry swap for all of them) and its marks of ancestors (one swap per ancestor).

What a batch's swap is: the commits' changes one after the other, in queue order (the
last change of a key wins, as between two swaps), applied by ``ManifestMemory._swap``
as one commit's changes are, so the rules of a single swap hold for the batch whole:
a swap is atomic, so its commits land together or not at all, and a refused swap is
judged on the head read after it for all of them. Each commit's answer is its own: the
batch's commits are answered together when the swap is done, and a swap that fails
fails the commits in it, and only them (the next ones go in a swap of their own). A
commit is refused alone only when its value object, past its lease, is gone
(``memory_lease``): ``apply`` refuses no change (what a change could be refused for,
``prepare`` refused before any request). The value objects the swap released (named by
rows it replaced) are the lead's answer: its operation runs on after the swap and
deletes them, whereas a commit it carried may have been cut short meanwhile.

A lead cut short mid-swap (a cancelled task) hands its batch back to the queue, first
in line; that swap may have landed. Those commits then go in a swap of their own (never
with commits that were not in the cut one: evidence about one of them is evidence about
all), and their value objects are first copied to fresh tokens, exactly as after a
refused swap of their own: a swap never names again an object that an earlier swap may
have named (a writer may since have replaced that row and deleted the object). A copy
that finds its source gone proves the cut swap landed, and was replaced since: those
commits are done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from s3_saver._format.memory.names import node_id
from s3_saver._index.manifest.memory_documents import _NEVER, Documents, _namespace
from s3_saver._index.memory import Change, Path, fresh_objects
from s3_saver._index.memory_lease import renewed
from s3_saver._transport.protocol import Op
from s3_saver.errors import StoreUnavailableError

_REGISTRY_QUEUE = "@registry"  # never a node id (64 hex digits)


@dataclass(eq=False)
class _Job:
    """One commit's share of a namespace's swap."""

    changes: list[Change]
    # The ETag of the head this commit read itself, or that this process swapped since
    # (``_NEVER``: none; None: there was no head): a head known current within the commit.
    read: object
    registered: object  # the ETag of the empty head it registered the namespace after reading
    # The last swap that carried it (None: none yet). Set before the swap's first request:
    # a lead cut short hands its commits back marked.
    tried: object = None
    moved: list[str] = field(default_factory=list)  # value objects it copied away from (their keys)


class GroupCommits(Documents):
    """Group commit of the memory index's swaps (see the module docstring); mixed into
    ``ManifestMemory``, whose ``_swap``, ``_register_now`` and ``_mark_now`` it drives."""

    _swap: Callable[[Path, list[Change], bool, object], Op[list[str]]]
    _register_now: Callable[[list[Path], frozenset[Path]], Op[None]]
    _mark_now: Callable[[Path], Op[None]]

    def _joined(self, path: Path, changes: list[Change], confirmed: bool, registered: object) -> Op[list[str]]:
        """``ManifestMemory._swap`` of ``changes``, in one swap with the other commits of
        this process to the head of ``path`` (``confirmed``: this commit read the head it
        holds; ``registered``: as ``_swap``'s)."""
        node = node_id(path)
        known = self._heads.get(node)
        read = known[0] if confirmed and known is not None else _NEVER
        job = _Job(list(changes), read, registered)
        released: list[str] = yield from self._group.join(node, job, lambda jobs: self._swap_jobs(path, jobs))
        return released

    def _swap_jobs(self, path: Path, jobs: list[_Job]) -> Op[list[Any]]:
        """The lead's swap: the jobs that went together before (a cut swap's) together,
        each such group a ``_swap`` of its own, in queue order. The answers: an error for
        the jobs of a group that failed; the keys released, for the lead (see above)."""
        answers: list[Any] = [[] for _ in jobs]
        for i, job in enumerate(jobs):
            # A value object past its lease is copied first, per commit: one whose object is
            # gone fails alone (``memory_lease``); none is, in the steady state (no request).
            try:
                job.changes = yield from renewed(self.s3, self.value_key, self.clock, path, job.changes)
            except StoreUnavailableError as exc:
                answers[i] = exc
        groups: dict[object, list[int]] = {}
        for i, job in enumerate(jobs):
            if not isinstance(answers[i], BaseException):
                groups.setdefault(job.tried, []).append(i)
        released: list[str] = []
        for members in groups.values():
            batch = [jobs[i] for i in members]
            try:
                released += yield from self._swap_group(path, batch)
            except Exception as exc:  # this swap's commits fail, and only they
                for i in members:
                    answers[i] = exc
        # The lead runs on: its operation deletes what the swaps released. (A lead whose own
        # swap failed hands them to the first commit answered without an error.)
        owner = next((i for i, a in enumerate(answers) if not isinstance(a, BaseException)), None)
        if owner is not None:
            answers[owner] = list(dict.fromkeys(released))
        return answers

    def _swap_group(self, path: Path, batch: list[_Job]) -> Op[list[str]]:
        tried = batch[0].tried
        attempt = object()
        for job in batch:
            job.tried = attempt  # before any request: a cut from here on may have swapped
        changes = [c for job in batch for c in job.changes]
        if tried is not None:
            # A swap that carried them was cut short: it may have landed (see above).
            fresh = yield from fresh_objects(self.s3, self, path, changes, _namespace(path))  # type: ignore[arg-type]
            if fresh is None:
                return [key for job in batch for key in job.moved]  # it landed, and was replaced since
            moved, old = fresh
            at = 0
            for job in batch:
                job.changes, at = moved[at : at + len(job.changes)], at + len(job.changes)
            batch[0].moved += [self.value_key(path, token) for token in old]
            changes = moved
        known = self._heads.get(node_id(path))
        etag = known[0] if known is not None else _NEVER
        confirmed = known is not None and any(job.read is not _NEVER and job.read == etag for job in batch)
        registered = etag if known is not None and any(job.registered == etag for job in batch) else _NEVER
        released = yield from self._swap(path, changes, confirmed, registered)
        # The objects copied away from: after this swap no row names them (each key's row
        # is now this swap's, naming the copies).
        return [*released, *(key for job in batch for key in job.moved)]

    def _register(self, paths: list[Path], renew: frozenset[Path] = frozenset()) -> Op[None]:
        """``_register_now``, in one registry swap with the other registrations of this
        process waiting meanwhile (each registration numbered in queue order)."""
        yield from self._group.join(_REGISTRY_QUEUE, (paths, renew), self._register_jobs)

    def _register_jobs(self, jobs: list[tuple[list[Path], frozenset[Path]]]) -> Op[list[Any]]:
        paths = list(dict.fromkeys(p for wanted, _ in jobs for p in wanted))
        renew = frozenset().union(*(r for _, r in jobs))
        yield from self._register_now(paths, renew)
        return [None] * len(jobs)

    def _mark(self, path: Path) -> Op[None]:
        """``_mark_now``, once for this process's marks of one ancestor waiting meanwhile."""
        yield from self._group.join(f"{node_id(path)}/desc", path, lambda jobs: self._mark_jobs(path, jobs))

    def _mark_jobs(self, path: Path, jobs: list[Path]) -> Op[list[Any]]:
        yield from self._mark_now(path)
        return [None] * len(jobs)
