"""List values stored as a keyframe and pieces: storage linear in a conversation.

LangGraph hands the saver the whole value of an append-only channel (an
``add_messages`` or ``operator.add`` list) at every step, so storing each
version whole costs 1 + 2 + ... + N elements. Here a new version whose
serialized elements start with exactly the serialized elements of the version
its parent stored (compared as bytes, so equality is exact) stores only what
follows, and its ``loc`` reference names the earlier pieces it reads
(``base.ref_pieces``): the first is a whole value (a keyframe), the others
pieces. Anything else (an edit, a removal, a reordering, a value that is not a
list, a base this process does not hold) is stored whole, as before.

Exactness by construction: a value is split at the byte level of its msgpack
array, and read back as the same header + the same bytes, so the user's
serializer gets byte for byte what it produced for the whole list.

Bounds (measured in ``make bench``'s long conversation): pieces merge like an
LSM's size tiers. A new piece takes in the last pieces of its chain while
``MERGE - 1`` of them are of its size tier or smaller, so a version reads about
(MERGE - 1) log_MERGE(n) pieces and each element is written about
(1 - 1/MERGE) log_MERGE(n) + 1 times; a chain never exceeds ``MAX_PIECES``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

# The size tiers: pieces below MERGE KB are tier 0, then each tier is MERGE times larger.
MERGE = 4
_TIER_UNIT = 1024
# A chain longer than this is stored whole (a keyframe) whatever the tiers say.
MAX_PIECES = 24
# The serializer tag whose bytes are msgpack (LangGraph's JsonPlusSerializer,
# and serializers that keep its tag): only those are split.
SPLITTABLE = "msgpack"


def array_header(data: bytes) -> tuple[int, int] | None:
    """(element count, header length) of a msgpack array, or None when ``data``
    is not one written with the shortest header (the only one rebuilt)."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        n = struct.unpack_from(">H", data, 1)[0]
        return (n, 3) if n >= 16 else None
    if first == 0xDD and len(data) >= 5:
        n = struct.unpack_from(">I", data, 1)[0]
        return (n, 5) if n >= 0x10000 else None
    return None


def header(count: int) -> bytes:
    """The shortest msgpack array header for ``count`` elements."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 0x10000:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


def join(count: int, bodies: list[bytes]) -> bytes:
    """The whole serialized list: its header, then every piece's bytes in order."""
    return header(count) + b"".join(bodies)


def body_of(data: bytes) -> bytes:
    """The elements' bytes of a whole stored list (a keyframe read as a piece)."""
    found = array_header(data)
    if found is None:
        raise ValueError("a delta's keyframe is not a msgpack array")
    return data[found[1]:]


def _tier(size: int) -> int:
    # 1e-9: exact powers of MERGE land in their own tier despite float rounding.
    return max(0, int(math.log(max(size, 1) / _TIER_UNIT, MERGE) + 1e-9))


def keep(sizes: list[int], new: int) -> int:
    """How many pieces of the base's chain (``sizes``, keyframe first) the new
    version reads before its own piece of ``new`` bytes; 0: store it whole.

    The new piece takes in the chain's last ``MERGE - 1`` pieces while none of
    them is of a larger tier than it (size tiers, as LSM stores compact).
    """
    k, tail = len(sizes), new
    while k >= MERGE - 1:
        run = sizes[k - (MERGE - 1) : k]
        if any(_tier(s) > _tier(tail) for s in run):
            break
        tail += sum(run)
        k -= MERGE - 1
    return k if k < MAX_PIECES else 0


@dataclass(frozen=True)
class Held:
    """A list value this process wrote or read: enough to store the next version as a delta."""

    type: str
    count: int
    data: bytes  # the whole serialized list, header included
    start: int  # where its elements begin (the header's length)
    sizes: tuple[int, ...]  # the byte size of each stored piece, keyframe first (its elements only)
    oldest: int  # the put time of its oldest piece (a ttl restores values past half of it)


def extends(held: Held, data: bytes) -> tuple[int, int] | None:
    """(count, header length) of ``data`` when it is ``held``'s list with
    elements appended (compared as bytes), else None."""
    found = array_header(data)
    if found is None or found[0] < held.count:
        return None
    start, size = found[1], len(held.data) - held.start
    if len(data) - start < size or memoryview(data)[start:start + size] != memoryview(held.data)[held.start:]:
        return None
    return found
