"""Encrypted worlds: the schedules run on savers with ``encryption=``, and what is checked beyond.

A world built with ``World(..., encryption="local" | "kms")`` gives every saver it builds the
same master key (a ``LocalKey``, or a ``KmsKey`` on the moto server's KMS): the processes of
one deployment. The model is the plaintext one, plus what encryption may answer: an operation
on a thread while an erase of it is under way (its key destroyed first, its deletes after), or
after one was cut short, may raise ``ThreadErasedError`` with no effect (``model._erase_raced``).
An erase cut short and abandoned is finished (called again by a fresh process, as the docs say
to) before the reads: until then its thread's content is unreadable by design.

After the schedule's reads and checks (``runner._verify``), for encrypted worlds:

(g) no plaintext: every version of every object under the schedule's prefix, every record of
    the key store and every index item of the prefix, decoded as deep as it goes (zlib, zstd,
    msgpack: ``test_encryption._layers``), holds none of the values the schedule wrote (each
    string of 20 characters or more in a checkpoint's channel values or a pending write);
(h) a copy's (an import's) objects are sealed under the target's keys, never the source's;
(i) last: every thread an erase answered for (or the harness finished), and that holds
    nothing now, is put back as it was just before the erase's first call -- each object
    the bucket held naming it made current again with its old bytes, each index item written
    back (as a restore from a backup or point-in-time recovery would) -- and a fresh process
    reads it: each read raises ``ThreadErasedError`` or finds nothing, never a checkpoint,
    never another error.

``ForeignCiphertextError``, ``PlaintextObjectError`` or garbage is an answer no model
operation accepts: a schedule that meets one fails (a).
"""

from __future__ import annotations

from typing import Any

from sim import model as M
from sim.workload import SUB_NS, cfg

NEEDLE_CHARS = 20  # shorter strings ("x", one word) could occur by chance


# -- what the world sees while the schedule runs -------------------------------------------
def before_call(world: Any, call: Any, writer: Any) -> None:
    """Before an erase's first call: the thread's objects and index items as they are (the
    backup (i) restores)."""
    model = writer.step.model
    if not isinstance(model, M.EraseThread) or model.t in world.before_erase:
        return
    prefix, t = world.prefix, model.t
    objects = []
    for key, _ in world.objects_naming(prefix, t):
        try:
            body = world.s3.get_object(Bucket=world.bucket, Key=key)["Body"].read()
        except world.s3.exceptions.NoSuchKey:
            continue
        objects.append((key, body))
    world.before_erase[t] = {"objects": objects, "items": world.items_naming(prefix, t)}


def record_written(world: Any, call: Any) -> None:
    """A key record PUT in the key store: remember its key id (h)."""
    from s3_saver._crypto.records import decode_record

    key = call.params["Key"]
    try:
        record = decode_record(bytes(call.params["Body"]), None, key)
    except Exception:
        return
    world.key_ids.setdefault(key, set()).add(record.key_id)


# -- before the reads ------------------------------------------------------------------------
def finish_abandoned_erases(world: Any, prefix: str, history: list[Any], problems: list[str]) -> set[str]:
    """Call again each erase that was cut short and abandoned (a fresh process); the threads."""
    finished: set[str] = set()
    for op in history:
        model = op.step.model
        if isinstance(model, M.EraseThread) and op.outcome is not None and op.outcome[0] == "abandoned":
            try:
                world.saver(prefix).erase_thread(model.t)
            except Exception as exc:
                problems.append(f"(i) erase_thread({model.t}) called again after a cut raised {_err(exc)}")
                continue
            finished.add(model.t)
    return finished


# -- after the reads -------------------------------------------------------------------------
def needles(scenario: Any) -> set[bytes]:
    """The written strings long enough to search for."""
    found: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, str):
            if len(value) >= NEEDLE_CHARS:
                found.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)

    models = [a.model for a in scenario.setup] + [s.model for steps in scenario.processes for s in steps]
    for model in models:
        if isinstance(model, M.Put):
            collect(model.checkpoint["channel_values"])
        elif isinstance(model, M.PutWrites):
            collect([value for _, value in model.writes])
    return {s.encode() for s in found}


def stored(world: Any, prefix: str) -> list[tuple[str, bytes]]:
    """Every version of every object under the prefix (bucket and key store), every
    attribute of every index item of the prefix."""
    from boto3.dynamodb.types import Binary

    found = []
    for bucket in (world.bucket, world.key_bucket):
        pages = world.s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
        try:
            pages = list(pages)
        except world.s3.exceptions.NoSuchBucket:
            continue  # no key store yet
        for page in pages:
            for v in page.get("Versions", ()):
                body = world.s3.get_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
                found.append((f"s3://{bucket}/{v['Key']}@{v['VersionId']}", body))
    for item in world.items_naming(prefix, ""):
        where = f"{world.table}:{item.get('pk', {}).get('S')}/{item.get('sk', {}).get('S')}"
        for name, value in item.items():
            ((kind, raw),) = value.items()
            if kind == "B":
                found.append((f"{where}/{name}", bytes(raw.value if isinstance(raw, Binary) else raw)))
            else:
                found.append((f"{where}/{name}", str(raw).encode()))
    return found


def plaintext_left(world: Any, prefix: str, scenario: Any) -> list[str]:
    """(g)"""
    from test_encryption import _layers

    wanted = needles(scenario)
    if not wanted:
        return []
    leaks = []
    for where, blob in stored(world, prefix):
        layers = _layers(blob)
        hits = [n for n in wanted if any(n in layer for layer in layers)]
        if hits:
            leaks.append(f"{where}: {hits[0][:60]!r}")
    return [f"(g) plaintext of written values in {len(leaks)} stored places: {leaks[:6]}"] if leaks else []


def copies_under_own_keys(world: Any, prefix: str, layout_prefix: str, history: list[Any]) -> list[str]:
    """(h) A copy's (an import's) objects name its own keys, none of its source's."""
    from s3_saver._crypto.envelope import is_sealed, key_id_of
    from s3_saver._crypto.records import decode_record, record_key

    def ids(t: str) -> set[bytes]:
        """Every key id the thread's record was seen to hold, and those its record names now."""
        key = record_key(layout_prefix, t)
        found = set(world.key_ids.get(key, ()))
        try:
            body = world.s3.get_object(Bucket=world.key_bucket, Key=key)["Body"].read()
        except world.s3.exceptions.NoSuchKey:
            return found
        record = decode_record(body, None, key)
        return found | {record.key_id} | {k for k, _ in record.earlier}

    pairs = set()
    for op in history:
        model = op.step.model
        if op.outcome is None or op.outcome[0] != "ok":
            continue
        if isinstance(model, M.CopyThread) or isinstance(model, M.ImportThread) and model.src is not None:
            pairs.add((model.src, model.dst))
    problems = []
    for src, dst in sorted(pairs):
        source_ids, own = ids(src), ids(dst)
        for key, _ in world.objects_naming(prefix, dst):
            try:
                body = world.s3.get_object(Bucket=world.bucket, Key=key)["Body"].read()
            except world.s3.exceptions.NoSuchKey:
                continue
            if not is_sealed(body):
                continue
            kid = key_id_of(body)
            if kid in source_ids:
                problems.append(f"(h) {key} of the copy {dst} is sealed under a key of its source {src}")
            elif kid not in own:
                problems.append(f"(h) {key} of the copy {dst} is sealed under a key that is not {dst}'s ({kid.hex() if kid else kid})")
    return problems[:6]


def unreadable_after_restore(world: Any, prefix: str, threads: set[str], state: M.ModelState) -> list[str]:
    """(i) Each erased thread that holds nothing now, put back as it was before its erase."""
    from s3_saver import ThreadErasedError

    restored = [t for t in sorted(threads) if t in world.before_erase and state.nothing(t)]
    for t in restored:
        backup = world.before_erase[t]
        for key, body in backup["objects"]:
            world.s3.put_object(Bucket=world.bucket, Key=key, Body=body)
        for item in backup["items"]:
            world.dynamodb.put_item(TableName=world.table, Item=item)
    problems = []
    reader = world.saver(prefix)
    for t in restored:
        reads = [
            ("list", lambda t=t: list(reader.list(cfg(t, None)))),
            ("get_tuple(root)", lambda t=t: reader.get_tuple(cfg(t, ""))),
            ("get_tuple(sub)", lambda t=t: reader.get_tuple(cfg(t, SUB_NS))),
        ]
        held = len(world.before_erase[t]["objects"]) + len(world.before_erase[t]["items"])
        for name, read in reads:
            try:
                got = read()
            except ThreadErasedError:
                continue
            except Exception as exc:
                problems.append(f"(i) {t} erased, put back as before its erase ({held} objects and items): {name} raised {_err(exc)}")
                continue
            if got:
                problems.append(f"(i) {t} erased, put back as before its erase ({held} objects and items): {name} read content")
    return problems


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"
