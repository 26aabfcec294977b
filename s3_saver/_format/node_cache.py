"""The node cache's keys and documents (``S3Cache``, LangGraph's ``BaseCache``).

Layout (under the user's ``prefix``, the same in both index modes)::

    node-cache/@gens                   the generations document, replaced by compare-and-swap
    node-cache/e/<ns id>/<key name>    one entry per (namespace, key), replaced by plain PUTs

``<ns id>`` is the SHA-256 of the namespace's canonical bytes (msgpack of its labels):
a namespace of any depth, length or characters gets one short, fixed-size folder. An
entry's ``<key name>`` is its key percent-encoded (``encode``) when that is short, else
``@`` and the SHA-256 of the key (``encode`` never produces ``@``, so the two spellings
never meet). Every entry stores its namespace and key, and a read compares them with
what it asked for: a hash collision is a miss, never another namespace's value.

Clearing never lists: the generations document holds an ``epoch`` (a random token, new
at every ``clear(None)``) and a generation per namespace id (bumped by ``clear(ns)``);
each entry carries the ``(epoch, gen)`` it was written under and is valid only while
they are the document's (see ``_ops/node_cache``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import ormsgpack

from s3_saver._format.codec import Typed, pack, typed, unpack
from s3_saver._format.key_codec import NODE_CACHE_PREFIX, _checked, encode
from s3_saver.errors import ConfigurationError, CorruptObjectError

GENS_FORMAT = "s3_saver.node-cache-gens/1"
ENTRY_FORMAT = "s3_saver.node-cache-entry/1"
GENS_NAME = "@gens"
ENTRY_FOLDER = "e/"
# Longer encoded keys are named by their hash (LangGraph's keys are 32 hex digits).
_KEY_NAME_MAX = 200
MAX_AGE_SECONDS = 30 * 24 * 3600
"""An entry older than this is a miss, whatever its ttl. A lifecycle rule may expire
``node-cache/`` objects after 31 days, the generations document included: the clears it
recorded then vanish, and every entry they cleared (written before the document's last
change, so older than 31 days) must already read as expired."""

Namespace = tuple[str, ...]
FullKey = tuple[Namespace, str]


def check_full_key(full_key: Any, where: str) -> FullKey:
    """``(namespace tuple, key)`` as given, or ConfigurationError naming it (and ``where``)."""
    if not isinstance(full_key, tuple) or len(full_key) != 2:
        raise ConfigurationError(f"{where}: a cache key is a (namespace tuple, key) pair, got {full_key!r}")
    ns, key = full_key
    return check_namespace(ns, where), check_text(key, "key", where)


def check_namespace(ns: Any, where: str) -> Namespace:
    if not isinstance(ns, tuple):
        raise ConfigurationError(f"{where}: a cache namespace is a tuple of strings, got {ns!r}")
    for label in ns:
        check_text(label, "namespace label", where)
    return ns


def check_text(text: Any, what: str, where: str) -> str:
    if not isinstance(text, str):
        raise ConfigurationError(f"{where}: a cache {what} must be a string, got {type(text).__name__}: {text!r}")
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"{where}: the cache {what} {text!r} is not valid Unicode text: {exc}") from exc
    return text


def check_ttl(ttl: Any, full_key: FullKey, where: str) -> float | None:
    """A ttl in seconds (None: no expiry), as LangGraph's caches take it. A negative
    one is accepted, as InMemoryCache does: the entry is expired from the start."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl):
        raise ConfigurationError(f"{where}: the ttl of {full_key!r} must be seconds (a finite number) or None, got {ttl!r}")
    return float(ttl)


def namespace_id(ns: Namespace) -> str:
    return hashlib.sha256(ormsgpack.packb(list(ns))).hexdigest()


class CacheKeys:
    """The node cache's keys under one bucket prefix (a checked prefix: ``check_prefix``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.root = prefix + NODE_CACHE_PREFIX
        self.gens_key = self.root + GENS_NAME

    def entry_key(self, ns: Namespace, key: str) -> str:
        try:
            name = encode(key)
        except ConfigurationError:
            name = ""  # a character ``encode`` refuses: named by its hash
        if not name or len(name) > _KEY_NAME_MAX:
            name = "@" + hashlib.sha256(key.encode()).hexdigest()
        return _checked(f"{self.root}{ENTRY_FOLDER}{namespace_id(ns)}/{name}")


@dataclass(frozen=True)
class Gens:
    """The generations document as read: ``etag`` None when there is none (nothing
    was ever cleared: epoch "" and every generation 0). ``denied``: its GET was answered
    403, which S3 gives for a missing key to a caller without ``s3:ListBucket``:
    absent or unreadable, not known which (a create with ``IfNoneMatch`` tells)."""

    epoch: str = ""
    gens: dict[str, int] = field(default_factory=dict)
    etag: str | None = None
    denied: BaseException | None = field(default=None, compare=False)

    def of(self, ns_id: str) -> tuple[str, int]:
        """The (epoch, gen) an entry of the namespace ``ns_id`` is valid under."""
        return self.epoch, self.gens.get(ns_id, 0)

    def bumped(self, ns_ids: list[str] | None, new_epoch: str) -> Gens:
        """The document after a clear: of these namespaces, or (None) of everything
        (a new epoch; no namespace's generation matters any more)."""
        if ns_ids is None:
            return Gens(new_epoch, {})
        gens = dict(self.gens)
        for ns_id in ns_ids:
            gens[ns_id] = gens.get(ns_id, 0) + 1
        return Gens(self.epoch, gens)


def pack_gens(gens: Gens) -> bytes:
    return pack({"format": GENS_FORMAT, "epoch": gens.epoch, "gens": gens.gens})


def read_gens(body: bytes, etag: str, where: str) -> Gens:
    record = unpack(body, GENS_FORMAT, where)
    epoch, gens = record.get("epoch"), record.get("gens")
    if not isinstance(epoch, str) or not isinstance(gens, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in gens.items()
    ):
        raise CorruptObjectError(f"{where}: not a node cache generations document")
    return Gens(epoch, gens, etag)


def entry_body(full_key: FullKey, value: Typed, gens: Gens, written: float, expires: float | None) -> bytes:
    ns, key = full_key
    epoch, gen = gens.of(namespace_id(ns))
    return pack(
        {
            "format": ENTRY_FORMAT, "ns": list(ns), "key": key, "epoch": epoch, "gen": gen,
            "written": written, "expires": expires, "value": list(value),
        }
    )


@dataclass(frozen=True)
class Entry:
    full_key: FullKey
    epoch: str
    gen: int
    written: float
    expires: float | None
    value: Typed

    def valid(self, gens: Gens, now: float) -> bool:
        """Under the current generations, unexpired (``now < expires``, as
        InMemoryCache) and younger than ``MAX_AGE_SECONDS``."""
        return (
            (self.epoch, self.gen) == gens.of(namespace_id(self.full_key[0]))
            and (self.expires is None or now < self.expires)
            and now < self.written + MAX_AGE_SECONDS
        )


def read_entry(body: bytes, where: str) -> Entry:
    record = unpack(body, ENTRY_FORMAT, where)
    try:
        ns, key, value = record["ns"], record["key"], record["value"]
        expires = record["expires"]
        entry = Entry(
            (tuple(ns), key), record["epoch"], record["gen"], float(record["written"]),
            None if expires is None else float(expires), typed(value),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptObjectError(f"{where}: not a node cache entry ({type(exc).__name__}: {exc})") from exc
    if not all(isinstance(x, str) for x in (*entry.full_key[0], key, entry.epoch)) or not isinstance(entry.gen, int):
        raise CorruptObjectError(f"{where}: not a node cache entry")
    return entry
