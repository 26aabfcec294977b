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
operation accepts: a schedule that meets one fails (a). Except in a migration's world
(a scenario with "migrate"): its setup is written by a saver without encryption, and its
"plain_*" processes write without it (old processes of the rollout); there an encrypting
operation may be refused plaintext (``model.plain_met``) and an old process's write may be
refused encrypted content (``model.plain_refused``), with no effect. Then:

(j) a migration cut short, with no other operation on its thread since it began, leaves
    the thread read from exactly one place (a reader without encryption or an encrypting
    one, the other refused by name), as it read just before the migration's first call;
    a migration that answered complete, with no write without encryption to its thread
    after it began, left no written value of the thread in storage; after the schedule
    (abandoned erases and deletes called again), ``encrypt_existing`` by a fresh process,
    the grace period over, ends complete for every thread, and one after it migrates
    nothing. An erase that began before the migration sealed its thread cannot make the
    backup (i) puts back unreadable: plaintext there may be refused as plaintext.

In a rotation's world (a scenario with "rewrap"), every process holds the world's new key,
the old one as ``previous``; the rewrap's target is the new key alone (``World.rotation``).
After the schedule (a rewrap abandoned, or none answered: called again by a fresh process):

(k) every live key record of the prefix is wrapped by the new key, and every read after
    the schedule ((a)-(i)) is a process's with the new key alone. In every encrypted world,
    the key an erase that answered destroyed is never live again (a rewrap's PUT over the
    erasure would bring it back).
"""

from __future__ import annotations

from typing import Any

from sim import model as M
from sim.workload import SUB_NS, cfg

NEEDLE_CHARS = 20  # shorter strings ("x", one word) could occur by chance


# -- what the world sees while the schedule runs -------------------------------------------
def before_call(world: Any, call: Any, writer: Any) -> None:
    """Before an erase's first call: the thread's objects and index items as they are (the
    backup (i) restores), and the id of its live key (which must never be live again, (k)).
    Before a migration's first call: the thread as read from where it is (j)."""
    model = writer.step.model
    if isinstance(model, M.EncryptThread) and model.t not in world.before_migrate:
        views = one_place(world, world.prefix, model.t)
        world.before_migrate[model.t] = views[0] if views[1] is None else None
        return
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
    world.before_erase[t] = {"objects": objects, "items": world.items_naming(prefix, t), "key": _live_key(world, t)}


def _record(world: Any, t: str) -> Any:
    """The thread's key record as stored now (None: none)."""
    from s3_saver._crypto.records import decode_record, record_key

    key = record_key(world.saver(world.prefix)._base_ctx.layout.prefix, t)
    try:
        body = world.s3.get_object(Bucket=world.key_bucket, Key=key)["Body"].read()
    except (world.s3.exceptions.NoSuchKey, world.s3.exceptions.NoSuchBucket):
        return None
    return decode_record(body, None, key)


def _live_key(world: Any, t: str) -> bytes | None:
    record = _record(world, t)
    return record.key_id if record is not None and record.live else None


# -- a migration (encrypt_thread) ---------------------------------------------------------------
def _view(reader: Any, t: str) -> list[Any]:
    return sorted(M.norm(x) for x in reader.list(cfg(t, None)))


def one_place(world: Any, prefix: str, t: str) -> tuple[Any, str | None]:
    """(j) The thread read from exactly one place: a process without encryption reads it
    whole and an encrypting one is refused by name, or the other way round. Returns (its
    view, None), or (None, what was wrong)."""
    from s3_saver import EncryptedObjectError, PlaintextObjectError

    found: dict[str, Any] = {}
    for name, options in (("without encryption", {"encryption": None}), ("encrypting", {})):
        try:
            found[name] = _view(world.saver(prefix, **options), t)
        except (PlaintextObjectError, EncryptedObjectError):
            continue  # the other kind's content, refused by name
        except Exception as exc:
            return None, f"a reader {name} raised {_err(exc)}"
    if len(found) != 1:
        return None, f"read by {sorted(found) or 'no reader'} (exactly one place must read it)"
    return next(iter(found.values())), None


def at_cut(world: Any, scheduler: Any, op: Any) -> None:
    """(j) A migration cut short: its thread reads from exactly one place, as it read before
    the migration began, when no other operation on it ran meanwhile (one that did may
    leave a write without encryption beside the migration's: read by neither, by design;
    the final migration after the schedule takes it)."""
    model = op.step.model
    if not isinstance(model, M.EncryptThread) or op.start is None:
        return
    t = model.t
    before = world.before_migrate.get(t)
    if before is None:
        return
    for p in scheduler.processes:
        for other in p.history:
            if other is op or t not in other.step.model.threads or other.start is None:
                continue
            if other.end is None or other.end >= op.start:
                return  # ran beside the migration
    view, wrong = one_place(world, world.prefix, t)
    where = f"(j) encrypt_thread({t}) cut after its call at tick {scheduler.tick}"
    if wrong is not None:
        world.cut_problems.append(f"{where}: the thread is {wrong}")
    elif view != before:
        gone = sorted({k for k, _ in before} - {k for k, _ in view})
        world.cut_problems.append(f"{where}: reads otherwise than before the migration (gone {gone})")


def finish_migrations(world: Any, prefix: str, scenario: Any, history: list[Any], problems: list[str]) -> None:
    """(j) A migration that answered complete, with no write without encryption to its thread
    after it began, left none of the thread's written values in storage. Then every thread
    of the prefix is migrated again by a fresh process, as an operator finishes a rollout
    once no old process runs (an hour later: the grace period over, nothing in flight):
    each must end complete, and a run after that must find nothing to do."""
    from unittest import mock

    wanted = needles(scenario)
    for op in history:
        model = op.step.model
        if not isinstance(model, M.EncryptThread) or op.outcome is None or op.outcome[0] != "ok" or not op.outcome[1].complete:
            continue
        t = model.t
        # A write without encryption beside it: the final pass takes it. (A delete or an
        # erase cut short and abandoned was called again before this look.)
        beside = [o for o in history if o.pid in scenario.plain and t in o.step.model.threads]
        if any(o.start is not None and (o.end is None or o.end >= op.start) for o in beside):
            continue
        leaks = [where for where, blob in stored(world, prefix) if t in where and _holds(blob, wanted)]
        if leaks:
            problems.append(f"(j) encrypt_thread({t}) answered complete at tick {op.end}, and {len(leaks)} stored places "
                            f"of the thread hold written values in plaintext: {leaks[:4]}")
    with mock.patch("s3_saver._ops.encrypt.GRACE", 0.0):
        for attempt in ("the final migration", "a migration after the final one"):
            try:
                statuses = list(world.saver(prefix).encrypt_existing())
            except Exception as exc:
                problems.append(f"(j) {attempt}: encrypt_existing raised {_err(exc)}")
                return
            bad = [s for s in statuses if not s.complete or (attempt != "the final migration" and s.migrated)]
            if bad:
                problems.append(f"(j) {attempt}: {bad[:3]}")
                return


def _item_blobs(item: dict[str, Any]) -> list[bytes]:
    from boto3.dynamodb.types import Binary

    out = []
    for value in item.values():
        ((kind, raw),) = value.items()
        out.append(bytes(raw.value if isinstance(raw, Binary) else raw) if kind == "B" else str(raw).encode())
    return out


def _holds(blob: bytes, wanted: set[bytes]) -> bool:
    from test_encryption import _layers

    layers = _layers(blob)
    return any(n in layer for n in wanted for layer in layers)


# -- a rotation (rewrap) ----------------------------------------------------------------------
def finish_rewraps(world: Any, prefix: str, history: list[Any], problems: list[str]) -> str | None:
    """(k) The rotation's key as records name it: a rewrap's that answered; none answered
    (cut short and abandoned), the harness runs it again (a fresh process), as the docs say
    to. None: it failed (a problem said so)."""
    writer_key, target = world.rotation()
    reports = [op.outcome[1] for op in history if isinstance(op.step.model, M.Rewrap) and op.outcome and op.outcome[0] == "ok"]
    if not reports or any(isinstance(op.step.model, M.Rewrap) and op.outcome[0] == "abandoned" for op in history):
        try:
            reports.append(world.saver(prefix, encryption=writer_key).rewrap(target))
        except Exception as exc:
            problems.append(f"(k) rewrap called again after the schedule raised {_err(exc)}")
            return None
    keks = {r.kek for r in reports}
    if len(keks) != 1:
        problems.append(f"(k) the rewraps name different keys: {sorted(keks)}")
        return None
    return keks.pop()


def records_under(world: Any, prefix: str, kek: str) -> list[str]:
    """(k) After a rewrap, every live key record of the prefix is wrapped by the new key."""
    from s3_saver._crypto.records import decode_record

    wrong = []
    pages = world.s3.get_paginator("list_objects_v2").paginate(Bucket=world.key_bucket, Prefix=prefix.rstrip("/") + "/")
    for page in pages:
        for obj in page.get("Contents", ()):
            body = world.s3.get_object(Bucket=world.key_bucket, Key=obj["Key"])["Body"].read()
            record = decode_record(body, None, obj["Key"])
            if record.live and record.kek != kek:
                wrong.append(f"{obj['Key']}: {record.kek}")
    return [f"(k) after the rewrap to {kek}, {len(wrong)} live key records are wrapped otherwise: {wrong[:4]}"] if wrong else []


def erased_keys_stay_erased(world: Any, history: list[Any]) -> list[str]:
    """(k) The key an erase that answered destroyed is never live again (a rewrap's PUT over
    the erasure, a copy of the record put back): a new life has a new key."""
    problems = []
    for op in history:
        model = op.step.model
        if not isinstance(model, M.EraseThread) or op.outcome is None or op.outcome[0] != "ok":
            continue
        destroyed = (world.before_erase.get(model.t) or {}).get("key")
        if destroyed is not None and _live_key(world, model.t) == destroyed:
            problems.append(f"(k) {model.t}: the key erase_thread destroyed (id {destroyed.hex()}) is live again")
    return problems


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


def finish_abandoned_deletes(world: Any, prefix: str, history: list[Any], problems: list[str]) -> list[str]:
    """A migration's world: call again each delete_thread cut short and abandoned (a fresh
    process, as after any cut), before the final migration: what it had not deleted yet
    of a thread written without encryption is plaintext, and the delete's to take (its
    thread is deleted: no migration visits it). Its effect then lands last, an order the
    model allows an abandoned operation. The threads."""
    finished = []
    for op in history:
        model = op.step.model
        if type(model) is M.DeleteThread and op.outcome is not None and op.outcome[0] == "abandoned":
            try:
                world.saver(prefix).delete_thread(model.t)
            except Exception as exc:
                problems.append(f"(j) delete_thread({model.t}) called again after a cut raised {_err(exc)}")
                continue
            finished.append(model.t)
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


def unreadable_after_restore(world: Any, prefix: str, threads: set[str], state: M.ModelState, scenario: Any = None) -> list[str]:
    """(i) Each erased thread that holds nothing now, put back as it was before its erase.
    One whose backup holds written values in plaintext (erased before a migration had
    sealed it) may be refused as plaintext: no key destroys what was never encrypted."""
    from s3_saver import PlaintextObjectError, ThreadErasedError

    wanted = needles(scenario) if scenario is not None and scenario.plain_setup else set()

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
        plain = wanted and (
            any(_holds(body, wanted) for _, body in world.before_erase[t]["objects"])
            or any(_holds(blob, wanted) for item in world.before_erase[t]["items"] for blob in _item_blobs(item))
        )
        for name, read in reads:
            try:
                got = read()
            except ThreadErasedError:
                continue
            except PlaintextObjectError as exc:
                if not plain:
                    problems.append(f"(i) {t} erased, put back as before its erase ({held} objects and items): {name} raised {_err(exc)}")
                continue
            except Exception as exc:
                problems.append(f"(i) {t} erased, put back as before its erase ({held} objects and items): {name} raised {_err(exc)}")
                continue
            if got:
                problems.append(f"(i) {t} erased, put back as before its erase ({held} objects and items): {name} read content")
    return problems


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"
