"""Whose key is it: the shapes of a layout's keys, and the savers nested inside its folders.

``check_prefix`` refuses every prefix that would lie inside another saver's
folders, so two accepted savers' keys never meet. What an earlier version wrote
under such a prefix (it accepted them) may still sit inside an accepted
saver's folders, and there a key can read as the outer saver's own:
``live/a/live/blobs/=/checkpoints/<id>`` is, to the saver of prefix ``""``, a
value of thread ``a`` (namespace ``live``, channel ``""``, version
``checkpoints``), and building that value's key gives the same string back.
The key alone cannot say whose it is. So a key counts as a layout's only if no
saver whose prefix lies inside the layout's folders builds it either
(``nested_prefix``); ``KeyLayout``'s parsers all ask.
"""

from __future__ import annotations

import re
from typing import Protocol

from s3_saver._format.key_codec import (
    ARCHIVE_PREFIX,
    ERASE_MARK,
    FOLDERS,
    LISTING_PREFIX,
    LIVE_PREFIX,
    MANIFEST_PREFIX,
    SET_ASIDE_PREFIX,
    decode,
    encode,
)
from s3_saver.errors import ConfigurationError


class Layout(Protocol):
    """What these shape tests read of a ``keys.KeyLayout`` (which calls them): its prefix, how
    its live keys parse, and its class, to make the layout of a nested prefix. Declared here,
    not imported: ``keys`` stands on this module, so this module names only what it reads."""

    prefix: str

    def __init__(self, prefix: str, *, nested: bool = ...) -> None: ...

    def _live_object(self, key: str) -> object | None: ...

# Names in the manifest folder besides the threads' folders: archive_idle's
# cursors ("#": never in a thread's folder name, see ``encode``) and setup's
# probes of conditional writes (written and deleted at once).
CURSORS = "#active"
PROBES = ".setup-probe"
# In the live folder besides the threads' folders: the marker of the prefix's
# index mode (``_transport/mode``; "#": never in a thread's folder name).
MODE_MARKER = "#index-mode"
# In a thread's manifest folder, besides its head: an erase's records and sealed segments.
ERASE_NAME = re.compile(re.escape(ERASE_MARK) + r"[^/]+")
SEGMENT_NAME = re.compile(r"segments/\d{8}\.[^/]+")


def exact_id(encoded: str) -> str | None:
    """The id ``encoded`` encodes, if ``encode`` gives exactly it back (so never one
    with a "/", nor another spelling of the same id), else None."""
    try:
        decoded = decode(encoded)
        return decoded if encoded and encode(decoded) == encoded else None
    except (ConfigurationError, UnicodeDecodeError, ValueError):
        return None


def nested_prefix(layout: Layout, key: str) -> str | None:
    """The prefix of a saver inside ``layout``'s folders under which ``key`` is a key
    that saver builds, else None.

    Such a prefix extends the layout's by segments the first of which is a
    folder name (see ``check_prefix``), so the key has a folder name as a later
    segment, and what follows it has the shape of that folder's keys. A key of
    the layout's own looks so only when its ids are folder names in the right
    places (a namespace ``archive`` whose checkpoint then reads as
    ``archive/checkpoints/<id>``): such an object is not taken for the layout's
    either, which at worst keeps it (an erase reports it).
    """
    if not key.startswith(layout.prefix):
        return None
    parts = key[len(layout.prefix) :].split("/")
    for j in range(1, len(parts) - 1):
        if parts[j] in FOLDERS:
            inner = type(layout)(layout.prefix + "".join(p + "/" for p in parts[:j]), nested=True)
            if builds(inner, key):
                return inner.prefix
    return None


def builds(layout: Layout, key: str) -> bool:
    """Whether ``key`` has the shape of a key ``layout`` builds, in any of its folders:
    ids exact (``exact_id``), tokens not checked (a looser test keeps more)."""
    if not key.startswith(layout.prefix):
        return False
    folder, _, rest = key[len(layout.prefix) :].partition("/")
    folder += "/"
    parts = rest.split("/")
    if folder == LIVE_PREFIX:
        return rest == MODE_MARKER or layout._live_object(key) is not None
    if folder == MANIFEST_PREFIX:
        if len(parts) == 2 and parts[0] in (CURSORS, PROBES):
            return bool(parts[1])
        name = "/".join(parts[1:])
        return exact_id(parts[0]) is not None and bool(
            name == "head" or ERASE_NAME.fullmatch(name) or SEGMENT_NAME.fullmatch(name)
        )
    if folder == LISTING_PREFIX:
        if len(parts) == 2 and parts[0] == "threads":
            inverted, dot, encoded = parts[1].partition(".")
            return bool(dot) and inverted.isdigit() and exact_id(encoded) is not None
        if len(parts) in (3, 4) and parts[0] == "active":  # <day>/<thread>[/<token>]
            return parts[1].isdigit() and exact_id(parts[2]) is not None and (len(parts) == 3 or bool(parts[3]))
        return len(parts) == 3 and parts[0] == "runs" and exact_id(parts[1]) is not None and exact_id(parts[2]) is not None
    if folder in (ARCHIVE_PREFIX, SET_ASIDE_PREFIX):
        return len(parts) == 2 and exact_id(parts[0]) is not None and bool(parts[1])
    return False
