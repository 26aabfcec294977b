"""Where a read was served from: ``ReadSource`` (what the saver tells its caller after a read
in a replica region), ``ReplicaReads`` (a replica site's lag policy and the newest state this
process saw there), and ``checkpoint_time`` (how far behind an answer is).

The reads produce these, so they stand with the operations; the regions (``_regions/``) build
the sites that carry them.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
from dataclasses import dataclass

# uuid6 counts 100 ns since 1582-10-15; the Unix epoch is this many of them later.
_UUID_EPOCH = 0x01B21DD213814000


@dataclass(frozen=True)
class ReadSource:
    """Where the last read of this thread of control was served from, and how stale it is.

    Attributes:
        site: ``"primary"`` or ``"replica"``.
        bucket: The bucket read.
        region: Its region (None: the AWS default).
        failover: True when the replica served it because the primary failed
            (now, or within ``Replica.recheck_after``).
        cause: The primary's failure that sent the read to the replica.
        checkpoint_id: The checkpoint returned (``get_tuple``), if any.
        newest_id: The newest checkpoint known for it: the replica's index's,
            or a newer one this process saw there before.
        skipped: Newer checkpoints passed over because their objects have not
            all arrived (replication lag), newest first.
        behind_seconds: How much older the returned checkpoint is than ``newest_id``.
        writes_behind: This process read more pending writes of the returned
            checkpoint there before: its index came back older (a manifest head
            replicated after a newer one).
    """

    site: str
    bucket: str
    region: str | None
    failover: bool = False
    cause: str | None = None
    checkpoint_id: str | None = None
    newest_id: str | None = None
    skipped: tuple[str, ...] = ()
    behind_seconds: float | None = None
    writes_behind: bool = False

    @property
    def stale(self) -> bool:
        """True when a newer state is known than the one returned."""
        return bool(self.skipped) or self.writes_behind or (
            self.newest_id is not None and (self.checkpoint_id is None or self.checkpoint_id < self.newest_id)
        )


def checkpoint_time(checkpoint_id: str) -> float | None:
    """The Unix time in a LangGraph checkpoint id (a uuid6), or None."""
    try:
        u = uuid.UUID(checkpoint_id)
    except (ValueError, TypeError, AttributeError):
        return None
    if u.version != 6:
        return None
    ticks = ((u.int >> 64) & 0xFFFFFFFFFFFF0000) >> 4 | ((u.int >> 64) & 0x0FFF)
    return (ticks - _UUID_EPOCH) / 1e7


class ReplicaReads:
    """The lag policy of a replica site's reads, and where each read's source is told.

    ``newest`` remembers the newest checkpoint id this process has seen in the
    replica per (thread, namespace): an index replicated late can show an older
    head after a newer one, and the answer must then say it is behind.
    """

    def __init__(self, site: str, bucket: str, region: str | None, on_lag: str, source: contextvars.ContextVar) -> None:
        self.site, self.bucket, self.region, self.on_lag = site, bucket, region, on_lag
        self.source = source
        self._newest: dict[tuple[str, str], str] = {}
        self._writes: dict[tuple[str, str, str], frozenset[tuple[str, str]]] = {}
        self._lock = threading.Lock()

    def seen(self, thread_id: str, ns: str, checkpoint_id: str | None) -> str | None:
        """Record ``checkpoint_id`` as seen; return the newest seen for (thread, ns)."""
        with self._lock:
            newest = self._newest.get((thread_id, ns))
            if checkpoint_id is not None and (newest is None or checkpoint_id > newest):
                newest = self._newest[(thread_id, ns)] = checkpoint_id
                if len(self._newest) > 4096:
                    self._newest.pop(next(iter(self._newest)))
            return newest

    def writes_behind(self, key: tuple[str, str, str], parts: frozenset[tuple[str, str]]) -> bool:
        """Are fewer pending-write parts of checkpoint ``key`` in the answer than this
        process saw before? (Else they are recorded as the newest seen.)"""
        with self._lock:
            if not parts >= self._writes.get(key, frozenset()):
                return True
            self._writes[key] = parts
            if len(self._writes) > 4096:
                self._writes.pop(next(iter(self._writes)))
            return False

    def tell(
        self, checkpoint_id: str | None, newest_id: str | None, skipped: list[str], writes_behind: bool = False
    ) -> None:
        served, newest = checkpoint_time(checkpoint_id or ""), checkpoint_time(newest_id or "")
        behind = max(0.0, newest - served) if served is not None and newest is not None else None
        previous = self.source.get()
        self.source.set(
            ReadSource(
                self.site,
                self.bucket,
                self.region,
                failover=bool(previous and previous.failover),
                cause=previous.cause if previous else None,
                checkpoint_id=checkpoint_id,
                newest_id=newest_id,
                skipped=tuple(skipped),
                behind_seconds=behind,
                writes_behind=writes_behind,
            )
        )
