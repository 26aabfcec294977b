"""The store's checks after a schedule with removals: what an erase or a sweep had to
remove is gone, from the bucket and from the index.

The rules of ``sim.store_model`` judge what reads return; these look at the bytes no
read returns (an expired row, a head's noncurrent version, a value object no row
names), which the guide promises gone:

* ``erased_bytes``: after an erase of a prefix answered, no object of a namespace
  under it (a head, a value object; on a versioned bucket every version) and no row
  holds the value of a put surely done before the erase began; only what the erase's
  report lists as remaining may (a young object a put in flight may still commit);
* ``swept_bytes``: after a sweep answered, no row is left of a put surely done before
  the sweep began and surely expired at the sweep's clock, nor its value object if the
  put answered (one cut before its commit may leave an object no item ever named); a
  replaced value's versions on a versioned bucket excepted: a lifecycle rule expires
  them, the guide says;
* ``replaced_expired``: the one value object the store leaves unnamed without a cut
  (DynamoDB mode): an expired item's, replaced by a new item (a transaction returns
  no old value to delete; the guide says so).

A value is known by its writer's label (``store_model.value_of``); a stored value is
read with the store's own format functions (heads, value objects, rows).
"""

from __future__ import annotations

from typing import Any

from sim import store_model as SM
from sim import store_rules as SR


def _writers(history: SR.History) -> dict[str, tuple[SM.KeyRef, SR.Write]]:
    """Each value's write (and its key), by the label the value carries."""
    found = {}
    for key, writes in history.writes.items():
        for w in writes:
            if isinstance(w.value, dict) and "w" in w.value:
                found[w.value["w"]] = (key, w)
    return found


def _versions(world: Any, folder: str) -> list[tuple[str, str | None, bool]]:
    """(key, version id, current) of every object (on a versioned bucket every version;
    delete markers hold no bytes) under ``folder``."""
    found: list[tuple[str, str | None, bool]] = []
    if world.versioned:
        for page in world.s3.get_paginator("list_object_versions").paginate(Bucket=world.bucket, Prefix=folder):
            found += [(v["Key"], v.get("VersionId"), bool(v.get("IsLatest"))) for v in page.get("Versions", ())]
    else:
        for page in world.s3.get_paginator("list_objects_v2").paginate(Bucket=world.bucket, Prefix=folder):
            found += [(o["Key"], None, True) for o in page.get("Contents", ())]
    return found


def labels_in(world: Any, reader: Any, key: str, version_id: str | None = None) -> list[str]:
    """The labels of the values an object (a version of it) holds: a head's inline rows,
    or a value object's value. In an encrypted world a sealed value is opened with
    ``reader``'s key of its namespace; one whose key is destroyed names no one (it reads
    nowhere: the erase's promise)."""
    from s3_saver._crypto.sealer import SEALED_TAG
    from s3_saver._format.codec import unpack
    from s3_saver._format.memory.documents import HEAD_FORMAT, HEAD_NAME, VALUE_FORMAT
    from s3_saver._format.memory.rows import (
        ValueCell,
        row_from_wire,
        unpack_value,
        value_from_wire,
    )
    from s3_saver._ops.memory import sealing
    from s3_saver.errors import ThreadErasedError

    params = {"Bucket": world.bucket, "Key": key, **({"VersionId": version_id} if version_id else {})}
    body = world.s3.get_object(**params)["Body"].read()
    if key.endswith("/" + HEAD_NAME):
        record = unpack(body, HEAD_FORMAT, key)
        rows_ = [row_from_wire(obj, key) for obj in record.get("rows") or []]
        cells = [(r.key, r.value) for r in rows_]
    else:
        record = unpack(body, VALUE_FORMAT, key)
        cells = [(record.get("key"), value_from_wire(record.get("value"), key))]
    path = tuple(record.get("path") or ())
    labels = []
    for item_key, cell in cells:
        if not isinstance(cell, ValueCell):
            continue
        if cell.type_tag == SEALED_TAG:
            mem = reader._memory
            if mem.crypt is None or not path:
                continue
            try:
                mem = reader._sync.run(sealing.keyed(mem, [path]))
                cell = sealing.open_value(mem, path, str(item_key), cell, key)
            except ThreadErasedError:  # NamespaceErasedError: its key destroyed
                continue
        labels.append(str(unpack_value(reader.serde, cell, key).get("w")))
    return labels


def _rows(reader: Any) -> dict[SM.Path, dict[str, Any]]:
    """Every row of the schedule's namespaces as the index holds it (expired ones too)."""
    snapshot = reader._sync.run(reader._memory.index.read(list(SM.NAMESPACES), {}))
    return {ns: dict(rows) for ns, rows in snapshot.nodes.items()}


def _inline_label(reader: Any, ns: SM.Path, row: Any) -> str | None:
    """The label of a row's inline value (opened in an encrypted world; None: no inline
    value, or sealed under a destroyed key)."""
    from s3_saver._crypto.sealer import SEALED_TAG
    from s3_saver._format.memory.rows import ValueCell, unpack_value
    from s3_saver._ops.memory import sealing
    from s3_saver.errors import ThreadErasedError

    cell = row.value
    if not isinstance(cell, ValueCell):
        return None
    if cell.type_tag == SEALED_TAG:
        if reader._memory.crypt is None:
            return None
        try:
            mem = reader._sync.run(sealing.keyed(reader._memory, [ns]))
            cell = sealing.open_value(mem, ns, row.key, cell, "a row")
        except ThreadErasedError:  # NamespaceErasedError: its key destroyed
            return None
    return str(unpack_value(reader.serde, cell, row.key).get("w"))


def _unregistered_before(history: SR.History, ns: SM.Path, e: SR.Write) -> bool:
    """Whether a removal other than ``e`` may have unregistered ``ns`` before ``e`` ended:
    a sweep, or another erase of it, begun before ``e`` ended, once a put may have
    registered ``ns`` (``KNOWN_UNREGISTERED`` in sim/store_runner.py)."""
    assert e.end is not None
    removals = [*history.sweeps, *(u for prefix, u in history.unlisters if SM.under(prefix, ns) and u is not e)]
    puts = [p for p in history.registers.get(ns, []) if p.may]
    return any(
        r.may and r.last is not None and r.start < e.end and any(p.start < r.last for p in puts) for r in removals
    )


def erased_bytes(
    world: Any, reader: Any, history: SR.History, erases: list[tuple[SM.Path, SR.Write, Any]]
) -> tuple[list[str], list[str]]:
    """Bytes of erased items left after the erases that answered (see the module
    docstring), and those of the known gap: left in the folder of a namespace the erase
    did not find registered, which another removal may have unregistered before."""
    if not erases:
        return [], []
    writers = _writers(history)
    index = reader._memory.index
    rows = _rows(reader)
    problems: list[str] = []
    gaps: list[str] = []
    for prefix, e, report in erases:
        kept = {(r.key, r.version_id) for r in report.remaining}
        registered = {tuple(ns) for ns in (*report.namespaces, *report.written_during)}
        where = f"{e.label} ({e.start}..{e.end}) erased {'/'.join(prefix) or '()'}"
        # Its namespaces, and the nodes between them and the prefix (empty heads).
        nodes = sorted({ns[:i] for ns in SM.NAMESPACES if SM.under(prefix, ns) for i in range(max(len(prefix), 1), len(ns) + 1)})
        for node in nodes:
            for key, version, current in _versions(world, index.node_folder(node)):
                if (key, version) in kept:
                    continue
                for label in labels_in(world, reader, key, version):
                    found = writers.get(label)
                    if found is not None and found[1].before(e):
                        w = found[1]
                        problem = (f"{where}, but {'the current' if current else 'a noncurrent'} version of {key} "
                                   f"still holds {w.label}'s value of {SR._show(found[0])}, written before the erase "
                                   f"began ({w.start}..{w.last})")
                        known = node not in registered and _unregistered_before(history, node, e)
                        (gaps if known else problems).append(problem)
        for ns in SM.NAMESPACES:
            if not SM.under(prefix, ns):
                continue
            for k, row in rows.get(ns, {}).items():
                label = _inline_label(reader, ns, row)
                found = writers.get(label) if label else None
                if found is not None and found[1].before(e):
                    problems.append(f"{where}, but the index still holds a row of {SR._show((ns, k))} with "
                                    f"{found[1].label}'s value, written before the erase began")
    return problems, gaps


def swept_bytes(world: Any, reader: Any, prefix: str, history: SR.History) -> list[str]:
    """Rows and value objects left of values a sweep that answered had to remove (see the
    module docstring)."""
    doomed: dict[str, tuple[SM.KeyRef, SR.Write, SR.Write]] = {}  # label -> (key, put, sweep)
    for s in (s for s in history.sweeps if s.ok and s.end is not None):
        for key, writes in history.writes.items():
            for w in writes:
                if not w.may or w.ttl is None or not isinstance(w.value, dict):
                    continue
                assert w.last is not None
                if w.last > s.start or s.since <= SR.Judge.expiry(w)[1]:
                    continue  # not surely done before the sweep, or not surely expired at its clock
                # The key's current item when the sweep read it: no other write of it between.
                if all(o is w or not o.may or o.before(w) or o.start >= s.end for o in writes):
                    doomed.setdefault(w.value["w"], (key, w, s))
    if not doomed:
        return []
    problems = []
    rows = _rows(reader)
    for label, (key, w, s) in sorted(doomed.items()):
        assert w.ttl is not None
        row = rows.get(key[0], {}).get(key[1])
        # A put's ttl has a fraction of its own: a row with it is that put's.
        if row is not None and row.ttl_minutes is not None and abs(row.ttl_minutes - SM.ttl_minutes(w.ttl)) < 1e-12:
            problems.append(f"{s.label} ({s.start}..{s.end}) swept after {w.label}'s value of {SR._show(key)} surely "
                            f"expired ({SR.Judge.expiry(w)[1]:g}), but the index still holds its row")
    for key_, _ in world.objects_naming(prefix, "/@v/"):
        for label in labels_in(world, reader, key_):
            # A put that did not answer may have left its object unnamed (cut before its
            # commit): no sweep knows of it (see ``_leftovers`` in sim/store_runner.py).
            if label in doomed and doomed[label][1].ok:
                key, w, s = doomed[label]
                problems.append(f"{s.label} ({s.start}..{s.end}) swept after {w.label}'s value of {SR._show(key)} surely "
                                f"expired, but its value object {key_} is still there")
    return problems


def replaced_expired(world: Any, reader: Any, history: SR.History, key: str) -> bool:
    """Whether the unnamed value object ``key`` holds a value with a ttl that another
    write of its key may have replaced once expired (DynamoDB mode's creation over an
    expired item leaves it)."""
    writers = _writers(history)
    for label in labels_in(world, reader, key):
        found = writers.get(label)
        if found is None or found[1].ttl is None:
            continue
        ref, w = found
        early, _ = SR.Judge.expiry(w)
        if any(o is not w and o.may and o.last is not None and o.last > early for o in history.writes.get(ref, [])):
            return True
    return False
