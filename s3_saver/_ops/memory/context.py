"""What every memory-store operation is given: ``Memory``, the index, the serializer and the
store's settings (the memory store's ``Context``). Its own module: the batch and the
sealing of values both take it, and neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langgraph.store.base import TTLConfig

from s3_saver._crypto.sealer import PLAIN, Sealer
from s3_saver._format.memory import ttl as ttl_core
from s3_saver._index.memory import MemoryIndex
from s3_saver._ops.source import ReplicaReads
from s3_saver._transport.protocol import PRIMARY
from s3_saver._transport.s3 import S3Calls


@dataclass(frozen=True)
class Memory:
    """What the batch needs besides the ops: the index, the serializer and the store's settings."""

    index: MemoryIndex
    s3: S3Calls
    serde: Any
    clock: ttl_core.Clock
    ttl_config: TTLConfig | None
    slack: float
    dims: int
    dtype: str
    # Set in a lag-safe region (``Route.as_reader``): a replica (then the batch is reads
    # alone: ``S3Store`` routes nothing else there), or the region written to when it may
    # name what never arrived (promoted after a failover, or one of a global table's).
    reads: ReplicaReads | None = None
    # With ``encryption=``: the memory store's keys (``Crypt.for_memory``), and the keys a
    # batch loaded (``sealing.keyed``).
    crypt: Any = None
    sealer: Sealer = PLAIN

    @property
    def read_only(self) -> bool:
        """Reads of a replica region: nothing may be written there before ``promote()``."""
        return self.reads is not None and self.reads.site != PRIMARY
