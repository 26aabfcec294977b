"""The memory index in the bucket (manifest mode): the two kinds of document, a
namespace's head and the registry, read and replaced by compare-and-swap, and what the
index's reads, writes and removals share (``memory`` and ``memory_removal`` build on it).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

from s3_saver._format.memory.documents import (
    Head,
    Registry,
    head_key,
    loads_head,
    loads_registry,
    registry_object_key,
    value_key,
)
from s3_saver._format.memory.names import node_id, show
from s3_saver._format.memory.rows import ValueCell, VectorsCell
from s3_saver._format.memory.ttl import Clock
from s3_saver._index.manifest.group import GroupCommit
from s3_saver._index.memory import Change, Path
from s3_saver._transport.budget import Cache, CacheBudget
from s3_saver._transport.failures import (
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import (
    Backoff,
    Call,
    Op,
    about,
    raise_failure,
)
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import StoreUnavailableError

_MAX_SWAPS = 20
_BACKOFF_MAX = 0.5  # seconds
_JITTER = random.SystemRandom()
_REGISTRY = "registry"
# A commit queued behind a lead swaps alone only when no lead of its head finished for
# this long: the retry budget. A burst of hundreds of puts from one event loop keeps the
# loop busy for seconds between swaps; a lead that is alive always answers within its
# budget, and one cut short hands on at once (``group``).
_WAIT_FOR_LEAD = 10.0
_ROW_BYTES = 256  # a decoded row's objects beside its bytes (an estimate, as the saver's ENTRY_BYTES)

# (ETag, document) as last read or written; ETag None: the object did not exist.
Known = tuple[str | None, Any]


_REGISTRY_SUBJECT = "the namespace registry"


def _namespace(path: Path, keys: Sequence[str] = ()) -> str:
    """A call's subject: the namespace (and the keys) its hashed key stands for."""
    text = f"namespace {show(path)}"
    if len(keys) == 1:
        return f"{text}, key {show(keys[0])}"
    return f"{text}, keys {', '.join(show(k) for k in keys[:3])}{', ...' if len(keys) > 3 else ''}" if keys else text


_NEVER = object()
_ANY = object()


def _ancestors(paths: Sequence[Path]) -> list[Path]:
    return sorted({p[:i] for p in paths for i in range(1, len(p))})


def _adds(changes: list[Change]) -> bool:
    # A reseal (the encryption migration's) never creates an item: it registers nothing.
    return any(c.value is not None and c.reseal is None for c in changes)


def _size(known: Known) -> int:
    """Bytes charged to the budget: the stored bytes of the rows (values, vectors, keys)
    and a fixed overhead per row and per registry entry."""
    doc = known[1]
    if isinstance(doc, Head):
        refs = sum(_ROW_BYTES + len(r.bloom) + len(r.min_key) + len(r.max_key) for r in [*doc.segments, *doc.retired])
        return 256 + refs + sum(_ROW_BYTES + len(r.key) + _cell(r.value) + _cell(r.vectors) for r in doc.rows.values())
    return 256 + sum(_ROW_BYTES + sum(len(label) for label in p) for p in doc.created)


def _cell(cell: Any) -> int:
    if isinstance(cell, ValueCell):
        return cell.size
    return len(cell.raw) if isinstance(cell, VectorsCell) else 0


class Documents:
    """The bucket, the prefix, the caches of heads and of the registry, and how an answer
    about one of them becomes a document (see the module docstring)."""

    def __init__(self, s3: S3Calls, prefix: str, budget: CacheBudget, clock: Clock) -> None:
        self.s3 = s3
        self.prefix = prefix
        self.clock = clock
        self._heads: Cache = budget.cache("mem-heads")
        self._registry: Cache = budget.cache("mem-registry", entries=1)
        # This process's concurrent swaps of one head, as one (``memory_group``).
        self._group = GroupCommit(threading.Lock(), _WAIT_FOR_LEAD)

    def describe(self, path: Path) -> str:
        return f"s3://{self.s3.bucket}/{head_key(self.prefix, node_id(path))}"

    def value_key(self, path: Path, token: str) -> str:
        return value_key(self.prefix, node_id(path), token)

    def _head_answer(self, path: Path, call: Call, answer: Any, held: Any = _ANY) -> Known:
        """The head an answer holds, cached; ``held``: what the cache held when the read
        went out, and the answer is cached only if it still does. A head this process
        swapped meanwhile (a commit of a burst) is newer than what a read sent before
        that swap may have found: a stale guess there would cost the next swap a 412
        and a read."""
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            known: Known = (None, Head(path))
        else:
            known = (answer["ETag"], loads_head(answer["Body"], path, f"s3://{self.s3.bucket}/{call.params['Key']}"))
        node = node_id(path)
        with self._heads.lock:
            if held is _ANY or self._heads.get(node) is held:
                self._heads.put(node, known, _size(known))
        return known

    def _registry_answer(self, call: Call, answer: Any) -> Known:
        if isinstance(answer, BaseException):
            if classify(answer, call.operation) != OBJECT_MISSING:
                raise_failure(call, answer)
            known: Known = (None, Registry())
        else:
            known = (answer["ETag"], loads_registry(answer["Body"], f"s3://{self.s3.bucket}/{call.params['Key']}"))
        self._registry.put(_REGISTRY, known, _size(known))
        return known

    def _read_registry(self) -> Op[tuple[int, Registry]]:
        """The registry as stored now (not as cached), and its ``seq``: a removal's fence."""
        call = about(self.s3.get(registry_object_key(self.prefix)), _REGISTRY_SUBJECT)
        (answer,) = yield (call,)
        _, registry = self._registry_answer(call, answer)
        return registry.seq, registry

    def _lost(self, call: Call, answer: BaseException, attempt: int, forget: Any) -> Op[None]:
        """A swap refused: another writer got there first (412, or 409 for a race S3 saw):
        forget the guess, pause briefly, read again. Any other failure is raised."""
        if error_code(answer) not in PRECONDITION_FAILED_CODES | CONDITIONAL_CONFLICT_CODES:
            raise_failure(call, answer)
        forget()
        go_on = yield Backoff(_JITTER.uniform(0, min(_BACKOFF_MAX, 0.01 * 2**attempt)), attempt)
        if go_on is False:
            # The retry budget (or deadline()) leaves no time for another swap. The 412 is
            # no error of the caller's: raised as is, it reached users as botocore's bare
            # PreconditionFailed (one process's burst of writers of one namespace met it).
            raise StoreUnavailableError(
                f"{call.describe()} in s3://{self.s3.bucket}: the document kept changing under {attempt} swaps "
                "within the retry budget: too many writers of one namespace at once; try again"
            )
