"""Namespaces and keys: LangGraph's rules, the store's limits, registry keys and node ids.

LangGraph's rules (``langgraph.store.base._validate_namespace_labels``): every label a
non-empty ``str`` without ``.`` or NUL. ``BaseStore.put`` also refuses an empty
namespace and the root label ``"langgraph"`` before it calls ``batch``; ops handed
straight to ``batch`` skip those checks in ``InMemoryStore`` (LangGraph's own tests put
``("langgraph", "foo")`` that way). The store checks every op's labels in ``batch``
(what ``validate_op_namespace`` recommends for stores that must), refuses an empty
namespace only where an item is put, and leaves the ``"langgraph"`` root to ``put``.

The store's own rules, the same in both index modes (so an export imports anywhere):
- a label must be valid Unicode text (UTF-8 encodable: no lone surrogates) without
  U+10FFFF, a noncharacter reserved as the upper bound of namespace ranges
  (``registry_bounds``);
- a key is a ``str`` of valid Unicode text of at most ``MAX_KEY_BYTES`` UTF-8 bytes
  (a DynamoDB sort key is at most 1,024 bytes; the item's holds a one-byte mark);
- a namespace's registry key is at most ``MAX_REGISTRY_KEY_BYTES`` UTF-8 bytes (it is
  a DynamoDB sort key of the registry partition).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import ormsgpack

from s3_saver.errors import ConfigurationError, KeyTooLongError, NamespaceError

MAX_KEY_BYTES = 1000
MAX_REGISTRY_KEY_BYTES = 1024
RESERVED = "\U0010ffff"

# The registry key: each label sort-encoded, joined by "!". Every character up to '"'
# (the separator "!" among them) becomes '"' and two upper-case hex digits, so the
# separator sorts below every encoded character and an escape below every character
# it does not replace: byte order of the keys (DynamoDB's, and Python's for these
# strings) is Python's tuple order of the namespaces. The same encoding as the saver's
# ``sort_encode`` (tests pin it).
_SEP = "!"
_ESCAPED = re.compile(r'[\x00-"]')


def show(namespace: Any, limit: int = 200) -> str:
    """A namespace (or key) for a message: its repr, cut to ``limit`` characters."""
    text = repr(namespace)
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text)} chars)"


def check_labels(namespace: Any, *, what: str = "namespace") -> tuple[str, ...]:
    """The namespace as a tuple, once every label passes LangGraph's rules and the store's.

    Raises NamespaceError (a LangGraph ``InvalidNamespaceError``) naming the label and
    the namespace. ``what`` names the role in the message ("namespace prefix", "match path").
    """
    if not isinstance(namespace, (tuple, list)):
        raise NamespaceError(
            f"Invalid {what} {show(namespace)}: a namespace is a tuple of strings, got {type(namespace).__name__}",
            (),
        )
    namespace = tuple(namespace)
    for label in namespace:
        # LangGraph's checks, in its order (so the same label gets the same complaint).
        if not isinstance(label, str):
            raise NamespaceError(
                f"Invalid namespace label {show(label)} found in {what} {show(namespace)}. Namespace labels"
                f" must be strings, but got {type(label).__name__}.",
                namespace,
            )
        if "." in label:
            raise NamespaceError(
                f"Invalid namespace label {show(label)} found in {what} {show(namespace)}. Namespace labels"
                " cannot contain periods ('.').",
                namespace,
            )
        if "\x00" in label:
            raise NamespaceError(
                f"Invalid namespace label {show(label)} found in {what} {show(namespace)}. Namespace labels"
                " cannot contain NUL bytes ('\\x00').",
                namespace,
            )
        if not label:
            raise NamespaceError(
                f"Namespace labels cannot be empty strings. Got {label!r} in {what} {show(namespace)}",
                namespace,
            )
        # The store's.
        try:
            label.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise NamespaceError(
                f"Invalid namespace label {show(label)} found in {what} {show(namespace)}: not valid Unicode"
                f" text ({exc.reason} at {exc.start})",
                namespace,
            ) from exc
        if RESERVED in label:
            raise NamespaceError(
                f"Invalid namespace label {show(label)} found in {what} {show(namespace)}: it holds U+10FFFF,"
                " a noncharacter the store reserves",
                namespace,
            )
    return namespace


def check_item_namespace(namespace: Any) -> tuple[str, ...]:
    """The namespace of an item being put: non-empty, valid labels, a registry key within
    the limit. (The ``"langgraph"`` root is ``BaseStore.put``'s check, not ``batch``'s.)"""
    namespace = check_labels(namespace)
    if not namespace:
        raise NamespaceError("Namespace cannot be empty: an item is put in a namespace of at least one label.", ())
    registry_key(namespace)
    return namespace


def check_key(namespace: tuple[str, ...], key: Any) -> str:
    """The key, once it is text the store can hold within ``MAX_KEY_BYTES``.

    Raises ConfigurationError (not a string, not valid Unicode) or KeyTooLongError, naming
    the namespace and the key. ``""`` is a valid key (LangGraph's ``str(key)`` of anything).
    """
    if not isinstance(key, str):
        raise ConfigurationError(
            f"key {show(key)} in namespace {show(namespace)}: keys are strings, got {type(key).__name__}"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"key {show(key)} in namespace {show(namespace)} is not valid Unicode text ({exc.reason} at {exc.start})"
        ) from exc
    if size > MAX_KEY_BYTES:
        raise KeyTooLongError(
            f"key {show(key)} in namespace {show(namespace)} is {size} bytes of UTF-8; the store holds keys of at"
            f" most {MAX_KEY_BYTES} bytes (in both index modes: a DynamoDB sort key is at most 1,024)"
        )
    return key


def _sort_encode(label: str) -> str:
    return _ESCAPED.sub(lambda m: f'"{ord(m.group()):02X}', label)


def registry_key(namespace: tuple[str, ...]) -> str:
    """The namespace's key in the registry (its sort key in DynamoDB mode; the sort key of
    manifest registry rows): ordered as Python orders the tuples, at most
    ``MAX_REGISTRY_KEY_BYTES`` bytes of UTF-8 (else KeyTooLongError naming the namespace).

    ``()`` maps to ``""``; labels are never empty, so the encoding is injective.
    Expects labels that passed ``check_labels``.
    """
    key = _SEP.join(_sort_encode(label) for label in namespace)
    size = len(key.encode("utf-8"))
    if size > MAX_REGISTRY_KEY_BYTES:
        raise KeyTooLongError(
            f"namespace {show(namespace)} is too long: its registry key is {size} bytes of UTF-8, the store allows"
            f" {MAX_REGISTRY_KEY_BYTES} (labels joined by one byte each; the characters NUL to '\"', the"
            " separator among them, count 3 bytes each)"
        )
    return key


def registry_bounds(prefix: tuple[str, ...]) -> tuple[str, str]:
    """``(lo, hi)`` such that a namespace starts with ``prefix`` exactly when its registry
    key ``k`` has ``lo <= k < hi`` (``lo`` is the prefix's own key: the prefix itself is in
    the range). ``hi`` ends with U+10FFFF, which no label holds; for ``()`` the range is
    every key: ``("", "\\U0010ffff")``."""
    lo = registry_key(prefix)
    return lo, (lo + _SEP if prefix else "") + RESERVED


def node_id(namespace: tuple[str, ...]) -> str:
    """The id naming a namespace's folder (manifest) or partition (DynamoDB): hex SHA-256
    of the canonical bytes ``ormsgpack.packb(list(namespace))``, 64 characters for any
    depth or length. Not injective in theory: every node document and record stores its
    namespace, and readers compare it with the one asked for (a mismatch is a
    CorruptObjectError naming both, never another user's items)."""
    return hashlib.sha256(ormsgpack.packb(list(namespace))).hexdigest()
