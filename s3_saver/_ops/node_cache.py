"""The node cache's operations (``S3Cache``): get, set and clear, written once as generators.

Clearing never lists the bucket: it bumps the generations document
(``_format/node_cache``) in one compare-and-swap, and an entry is valid only under
the ``(epoch, gen)`` the document holds now. So:

* ``get`` sends the entries' GETs and the document's GET in one round trip, and
  returns an entry only if it matches the document read beside it. A get that
  starts after a clear returned reads the bumped document (S3 reads are strongly
  consistent), so it returns nothing that clear removed.
* ``set`` PUTs each entry under the generations this process last read, and GETs
  the document again in the same round trip. An entry whose namespace's
  generations changed meanwhile is written again under the new ones (else a
  process that last read them before another's clear would write entries no get
  ever accepts). An entry written under generations that a clear bumped is never
  valid again: a set that returned before a clear began is cleared by it, and a
  set racing a clear lands either before it (cleared) or after it.
* ``clear`` replaces the document with ``IfMatch`` on the ETag last read (with
  ``IfNoneMatch`` when there is none yet); on a 412 it reads it again and retries.

Entries are replaced by plain PUTs, last writer wins: a PUT is never torn, and a
lost entry is a cache miss. Cleared and expired entries stay until overwritten or
removed by a lifecycle rule (their bytes only: no get returns them).

``get`` and ``set`` return what went wrong beside their result; the facade logs it
(a node cache must never fail a run that would succeed without it). ``clear`` raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from s3_saver._crypto.envelope import is_sealed
from s3_saver._crypto.records import STORE_KEY
from s3_saver._crypto.sealer import PLAIN
from s3_saver._format.codec import Typed
from s3_saver._format.keys import new_token
from s3_saver._format.node_cache import (
    CacheKeys,
    Entry,
    FullKey,
    Gens,
    Namespace,
    entry_body,
    namespace_id,
    pack_gens,
    read_entry,
    read_gens,
)
from s3_saver._transport.failures import (
    BUCKET_MISSING,
    BUCKET_OURS_CODES,
    CONDITIONAL_CONFLICT_CODES,
    OBJECT_MISSING,
    PRECONDITION_FAILED_CODES,
    classify,
    error_code,
)
from s3_saver._transport.protocol import Backoff, Call, Op, backoff, failure, gather
from s3_saver._transport.s3 import S3Calls
from s3_saver.errors import S3SaverError, StoreUnavailableError

# S3's answer to the GET of a missing key for a caller without s3:ListBucket.
_MISSING_OR_DENIED = frozenset({"AccessDenied"})
# Rounds of a set whose generations kept changing, and swaps of a clear that kept losing.
_SET_ROUNDS = 3
_CLEAR_ATTEMPTS = 8


class CacheState:
    """What one cache object knows between calls: the generations it read last (None:
    none yet). Shared by the threads and event loops that use the object."""

    def __init__(self) -> None:
        self.gens: Gens | None = None


@dataclass(frozen=True)
class Where:
    """The cache's place, for its calls and messages."""

    s3: S3Calls
    keys: CacheKeys
    # With ``encryption=`` (a cache made from an encrypting saver): the memory store's
    # keys (``Crypt.for_memory``); every entry is sealed under the store-wide key.
    crypt: Any = None

    def describe(self) -> str:
        return f"the node cache in s3://{self.s3.bucket}/{self.keys.root}"


def _sealer(where: Where, create: bool) -> Op[Any]:
    """The sealer of the store-wide key (``STORE_KEY``: one for every entry, made on the
    first write; none sent when cached). None without encryption.

    One key for the whole cache, not one per namespace: the cache's namespaces are
    LangGraph's (a node's name and function), not a user's, its entries are kept for a
    node's ttl only, and ``clear`` invalidates by generation, never by destroying bytes;
    a per-namespace key would cost a key GET per node on a cold start for nothing an
    erase needs."""
    if where.crypt is None:
        return None
    keys = yield from where.crypt.load([STORE_KEY], create=create)
    return where.crypt.sealer(keys)


def _entry_calls(calls: tuple[Call, ...]) -> Op[list[Any]]:
    results = yield calls
    return list(results)


def _gens_of(where: Where, call: Call, result: Any) -> Gens:
    """The document a GET answered (absent: the initial one; 403: ``Gens.denied``), or
    the call's failure raised."""
    if isinstance(result, BaseException):
        if classify(result, "get_object") == OBJECT_MISSING:
            return Gens()
        if error_code(result) in _MISSING_OR_DENIED:
            return Gens(denied=failure(call, result))
        raise failure(call, result)
    return read_gens(result["Body"], result["ETag"], f"s3://{where.s3.bucket}/{call.params['Key']}")


def load_gens(where: Where, state: CacheState) -> Op[Gens]:
    call = where.s3.get(where.keys.gens_key)
    results = yield (call,)
    gens = _gens_of(where, call, results[0])
    if gens.denied is None:
        state.gens = gens
    return gens


def get(where: Where, state: CacheState, keys: list[FullKey], now: float) -> Op[tuple[dict[FullKey, Typed], list[str]]]:
    """The valid entries of ``keys`` (each once), and what could not be read."""
    if not keys:
        return {}, []
    entry_calls = [where.s3.get(where.keys.entry_key(ns, key)) for ns, key in keys]
    gens_call = where.s3.get(where.keys.gens_key)
    try:
        # The store-wide key loaded beside the entries' GETs (a cold process's key GET
        # in the same wave; KMS Decrypt after).
        sealer, results = yield from gather(_sealer(where, False), _entry_calls((*entry_calls, gens_call)))
    except S3SaverError as exc:
        return {}, [f"{where.describe()}: its key could not be loaded, so {len(keys)} keys missed: {exc}"]
    try:
        gens = _gens_of(where, gens_call, results[-1])
        if gens.denied is not None:
            raise gens.denied
    except S3SaverError as exc:
        # Without the generations no entry can be trusted: all are misses.
        return {}, [f"{where.describe()}: its generations could not be read, so {len(keys)} keys missed: {exc}"]
    state.gens = gens
    found: dict[FullKey, Typed] = {}
    problems: list[str] = []
    for full_key, call, result in zip(keys, entry_calls, results):
        name = f"s3://{where.s3.bucket}/{call.params['Key']}"
        if isinstance(result, BaseException):
            # A 403 beside a generations document that was readable (the same folder,
            # the same rights): the entry is absent, to a caller without s3:ListBucket.
            if classify(result, "get_object") != OBJECT_MISSING and error_code(result) not in _MISSING_OR_DENIED:
                problems.append(f"{where.describe()}: {full_key!r} missed: {failure(call, result)}")
            continue
        try:
            body = result["Body"]
            if sealer is not None or is_sealed(body):
                # Sealed (refused as plaintext with encryption; as sealed without).
                body = (sealer or PLAIN).open(STORE_KEY, call.params["Key"], body, name)
            entry = read_entry(body, name)
        except S3SaverError as exc:
            problems.append(f"{where.describe()}: {full_key!r} missed: {exc}")
            continue
        # The entry names what it holds: another (namespace, key) under the same
        # object key (a hash collision) is a miss, never that other value.
        if entry.full_key == full_key and entry.valid(gens, now):
            found[full_key] = entry.value
    return found, problems


def put(
    where: Where, state: CacheState, entries: dict[FullKey, tuple[Typed, float | None]], now: float
) -> Op[list[str]]:
    """Write the entries (value, expiry time); what could not be written (dropped)."""
    if not entries:
        return []
    gens = state.gens
    if gens is None:
        try:
            gens = yield from _known_gens(where, state)
        except S3SaverError as exc:
            return [f"{where.describe()}: its generations could not be read, so {len(entries)} entries were dropped: {exc}"]
    try:
        sealer = yield from _sealer(where, True)
    except S3SaverError as exc:
        return [f"{where.describe()}: its key could not be loaded, so {len(entries)} entries were dropped: {exc}"]
    pending = list(entries)
    problems: list[str] = []
    for _ in range(_SET_ROUNDS):
        puts = []
        for fk in pending:
            key = where.keys.entry_key(*fk)
            body = entry_body(fk, entries[fk][0], gens, now, entries[fk][1])
            puts.append(where.s3.put_replace(key, sealer.seal(STORE_KEY, key, body) if sealer is not None else body))
        gens_call = where.s3.get(where.keys.gens_key)
        results = yield (*puts, gens_call)
        written = []
        for fk, call, result in zip(pending, puts, results):
            if isinstance(result, BaseException):
                problems.append(f"{where.describe()}: {fk!r} dropped: {failure(call, result)}")
            else:
                written.append(fk)
        try:
            now_gens = _gens_of(where, gens_call, results[-1])
            if now_gens.denied is not None:
                raise now_gens.denied
        except S3SaverError as exc:
            # What was written is valid at most under the generations it names:
            # never a value a clear removed. Only its use is in doubt.
            problems.append(f"{where.describe()}: its generations could not be read again after a set: {exc}")
            return problems
        state.gens = now_gens
        # Written under generations that are no longer current: no get would accept
        # them. Written again under the current ones (a clear that landed meanwhile
        # came first: the value was set after it).
        pending = [fk for fk in written if gens.of(namespace_id(fk[0])) != now_gens.of(namespace_id(fk[0]))]
        gens = now_gens
        if not pending:
            return problems
    problems.append(f"{where.describe()}: the generations kept changing, so {len(pending)} entries were dropped")
    return problems


def _known_gens(where: Where, state: CacheState) -> Op[Gens]:
    """The generations, read; when S3 will not say whether the document exists (403),
    created as the initial one with ``IfNoneMatch``: written, it was absent; refused
    (412), it exists and cannot be read: the GET's failure is raised."""
    gens = yield from load_gens(where, state)
    if gens.denied is None:
        return gens
    call = where.s3.put_swap(where.keys.gens_key, pack_gens(Gens()), None)
    (result,) = yield (call,)
    if isinstance(result, BaseException):
        raise gens.denied if error_code(result) in PRECONDITION_FAILED_CODES else failure(call, result)
    state.gens = known = Gens(etag=result["ETag"])
    return known


def clear(where: Where, state: CacheState, namespaces: list[Namespace] | None, token: Callable[[], str] = new_token) -> Op[None]:
    """Bump the generations of ``namespaces`` (None: the epoch: everything)."""
    if namespaces is not None and not namespaces:
        return
    ns_ids = None if namespaces is None else sorted({namespace_id(ns) for ns in namespaces})
    gens = state.gens
    if gens is None:
        gens = yield from load_gens(where, state)
    # A 403 on the document (``Gens.denied``): the swap below creates it with
    # IfNoneMatch, as if absent; a 412 then says it exists and cannot be read.
    for attempt in range(1, _CLEAR_ATTEMPTS + 1):
        new = gens.bumped(ns_ids, token())
        call = where.s3.put_swap(where.keys.gens_key, pack_gens(new), gens.etag)
        results = yield (call,)
        result = results[0]
        if not isinstance(result, BaseException):
            state.gens = replace(new, etag=result["ETag"])
            return
        code = error_code(result)
        if code in PRECONDITION_FAILED_CODES:
            if gens.denied is not None:
                raise gens.denied
            # Another clear (or this one's first try, whose answer was lost) swapped
            # it: read again and bump what is there now.
            gens = yield from load_gens(where, state)
        elif code in CONDITIONAL_CONFLICT_CODES:
            if (yield Backoff(backoff(attempt), attempt)) is False:
                break
        else:
            raise failure(call, result)
    raise StoreUnavailableError(
        f"{where.describe()}: clear gave up after {_CLEAR_ATTEMPTS} attempts: other clears kept replacing "
        f"{where.keys.gens_key!r} first; try again"
    )


def setup(where: Where, region: str | None) -> Op[None]:
    """Create the bucket when missing (a bucket that exists is left as it is) and, with
    encryption, the key store (never versioned: a versioned one is refused)."""
    head_call = where.s3.head_bucket()
    (head,) = yield (head_call,)
    if isinstance(head, BaseException):
        if classify(head, "head_bucket") != BUCKET_MISSING:
            raise failure(head_call, head)
        create = where.s3.create_bucket(region)
        (created,) = yield (create,)
        if isinstance(created, BaseException) and error_code(created) not in BUCKET_OURS_CODES:
            raise failure(create, created)
    if where.crypt is not None:
        yield from where.crypt.store.setup(region)


__all__ = ["CacheState", "Entry", "Where", "clear", "get", "load_gens", "put", "setup"]
