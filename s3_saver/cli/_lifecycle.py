"""Whole threads: ``copy``, ``prune``, ``delete``, ``erase``, ``encrypt``, ``archive``, ``restore``, ``export``, ``import``.

Destructive commands (``prune``, ``delete``, ``erase``, ``encrypt``) ask on a terminal and refuse in a
pipe without ``--yes``. Commands over several threads call the saver thread by
thread, so the progress bar moves and an interrupted run says how far it got.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
from datetime import datetime, timedelta
from typing import Any

import click

from s3_saver.cli._app import EXIT_FAILED, EXIT_OK, App, NotFoundError, pass_app
from s3_saver.cli._inspect import not_found, thread_exists
from s3_saver.cli._output import human_bytes, plural, shown, shown_list
from s3_saver.cli._params import Duration

ARCHIVE_CLASSES = ("GLACIER_IR", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "STANDARD", "GLACIER", "DEEP_ARCHIVE")


# -- copy --------------------------------------------------------------------------------
@click.command("copy", short_help='Copy a thread into a new thread.')
@click.argument("source")
@click.argument("target")
@pass_app
def copy_command(app: App, source: str, target: str) -> None:
    """Copy every checkpoint of SOURCE into TARGET (a thread with no checkpoints); run again to finish a copy cut short."""
    saver = app.saver()
    if not thread_exists(app, source):
        raise not_found(app, source)
    saver.copy_thread(source, target)
    if app.out.json:
        app.out.emit_json({"source": source, "target": target})
    else:
        app.out.message(f"copied thread {source!r} to {target!r}")


# -- prune -------------------------------------------------------------------------------
@click.command("prune", short_help='Remove the older checkpoints of threads.')
@click.argument("threads", nargs=-1, required=True)
@click.option(
    "--keep-last", type=click.IntRange(min=1), metavar="N", default=None, help="Checkpoints kept per namespace (default 1)."
)
@click.option("--strategy", type=click.Choice(["keep_latest", "delete"]), default="keep_latest", show_default=True)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def prune_command(app: App, threads: tuple[str, ...], keep_last: int | None, strategy: str, yes: bool) -> None:
    """Remove older checkpoints of THREADs (what the kept ones read stays), or delete them (--strategy delete)."""
    if strategy == "delete" and keep_last is not None:
        raise click.UsageError("--keep-last goes with --strategy keep_latest")
    newest = f"newest {keep_last} checkpoints" if keep_last and keep_last > 1 else "newest checkpoint"
    kept = "every checkpoint" if strategy == "delete" else f"all but the {newest} of each namespace"
    app.confirm(f"prune {plural(len(threads), 'thread')} ({shown_list(threads)}): remove {kept}", yes)
    saver = app.saver()
    done: list[str] = []
    with app.out.progress("prune", total=len(threads)) as tracker:
        for thread in threads:
            saver.prune([thread], strategy=strategy, keep_last=keep_last)
            done.append(thread)
            tracker.advance(description=f"prune {shown(thread)}")
    if app.out.json:
        app.out.emit_json({"pruned": done, "strategy": strategy, "keep_last": keep_last})
    else:
        app.out.message(f"pruned {plural(len(done), 'thread')} ({kept} removed): {shown_list(done)}")


# -- delete ------------------------------------------------------------------------------
@click.command("delete", short_help='Delete threads, or runs (--run).')
@click.argument("ids", nargs=-1, required=True, metavar="THREAD...|--run RUN_ID...")
@click.option("--run", "runs", is_flag=True, help="The ids are run ids: delete every checkpoint of those runs (delete_for_runs).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def delete_command(app: App, ids: tuple[str, ...], runs: bool, yes: bool) -> None:
    """Delete THREADs (every namespace, checkpoint and object), or with --run the checkpoints of runs.

    Run it again to finish a delete that was cut short."""
    kind = "run" if runs else "thread"
    app.confirm(f"delete {plural(len(ids), kind)} ({shown_list(ids)})", yes)
    saver = app.saver()
    known = set(saver.threads_of_runs(list(ids))) if runs else {one for one in ids if thread_exists(app, one)}
    done: list[str] = []
    with app.out.progress("delete", total=len(ids), unit=f"{kind}s") as tracker:
        for one in ids:
            # Unknown ids too: what a delete cut short left of them is finished.
            if runs:
                saver.delete_for_runs([one])
            else:
                saver.delete_thread(one)
            if one in known:
                done.append(one)
            tracker.advance(description=f"delete {shown(one)}")
    missing = [one for one in ids if one not in known]
    if done:
        if app.out.json and not missing:
            app.out.emit_json({"deleted_runs" if runs else "deleted_threads": done})
        else:
            app.out.message(f"deleted {plural(len(done), kind)}: {shown_list(done)}")
    if missing:
        names = ", ".join(map(repr, missing))
        what = "no checkpoints of run" if runs else "no thread"
        deleted = f" (deleted: {shown_list(done)})" if done and app.out.json else ""
        raise NotFoundError(f"{what} {names} in {app.store_name()}: nothing to delete{deleted}")


# -- erase -------------------------------------------------------------------------------
def _iso(when: datetime | None) -> str:
    return when.isoformat() if when is not None else ""


@click.command("erase", short_help="Delete threads and every version of their objects.")
@click.argument("threads", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def erase_command(app: App, threads: tuple[str, ...], yes: bool) -> int:
    """Delete THREADs as delete does, then every version and delete marker of their
    objects (a versioned bucket keeps them), in the replica too (erase_thread).

    One small record per thread stays, so a run in flight cannot bring it back.
    Versions an Object Lock holds stay and are listed (exit 1); run it again
    once their retention ends, or to finish an erase cut short."""
    app.confirm(f"erase {plural(len(threads), 'thread')} ({shown_list(threads)}) and every version of their objects", yes)
    saver = app.saver()
    reports = []
    with app.out.progress("erase", total=len(threads)) as tracker:
        for thread in threads:
            reports.append(saver.erase_thread(thread))
            tracker.advance(description=f"erase {shown(thread)}")
    remaining = [r for report in reports for r in report.remaining]
    if app.out.json:
        app.out.emit_json(
            {
                "erased_threads": [r.thread_id for r in reports],
                "deleted_versions": sum(r.deleted for r in reports),
                "remaining": remaining_json(remaining),
            }
        )
    else:
        deleted = sum(r.deleted for r in reports)
        app.out.message(
            f"erased {plural(len(reports), 'thread')} ({plural(deleted, 'version')} and delete markers removed): "
            f"{shown_list([r.thread_id for r in reports])}"
        )
        print_remaining(app, remaining)
    return EXIT_FAILED if remaining else EXIT_OK


def remaining_json(remaining: list[Any]) -> list[dict[str, Any]]:
    """An erase's ``remaining`` (``RemainingVersion``s) for ``--json``."""
    return [{**dataclasses.asdict(r), "retain_until": _iso(r.retain_until) or None} for r in remaining]


def print_remaining(app: App, remaining: list[Any]) -> None:
    """The versions an erase left, as a table (nothing when none)."""
    if remaining:
        rows = [
            (r.bucket, r.key, r.version_id or "", r.reason, r.mode or "", _iso(r.retain_until), "on" if r.legal_hold else "")
            for r in remaining
        ]
        columns = ("bucket", "key", "version", "reason", "mode", "retain until", "legal hold")
        app.out.print(app.out.table(columns, rows, title=f"{plural(len(remaining), 'version')} remain"))


# -- encrypt ----------------------------------------------------------------------------
@click.command("encrypt", short_help="Encrypt threads written without encryption.")
@click.option("--thread", "threads", multiple=True, metavar="ID", help="Only this thread (repeat for more); default: every thread.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def encrypt_command(app: App, threads: tuple[str, ...], yes: bool) -> int:
    """Encrypt every thread (or each --thread) under its own key, with the key the
    global --kms-key or --local-key gives (encrypt_existing); without --thread, the
    long-term memory (S3Store) on the same prefix too, each namespace under its own
    key (encrypt_namespaces).

    Each thread is written again encrypted, the index switched to it, then the
    plaintext objects and every version a versioned bucket kept of them are
    deleted; each memory item is written again encrypted in its place. Cut short,
    run it again: it finishes, and passes over threads and namespaces done.
    Exit 1 while a thread or namespace is left: archived in GLACIER or
    DEEP_ARCHIVE (restore it first), written to throughout (run again), or
    versions a lock holds."""
    if app.encryption() is None:
        raise click.UsageError("encrypt encrypts with the key given by --kms-key or --local-key: give one")
    which = f"{plural(len(threads), 'thread')} ({shown_list(threads)})" if threads else "every thread"
    app.confirm(f"encrypt {which}, deleting the plaintext objects and their versions", yes)
    saver = app.saver()
    statuses = []
    with app.out.progress("encrypt", total=len(threads) or None) as tracker:
        for status in saver.encrypt_existing(list(threads) if threads else None):
            statuses.append(status)
            tracker.advance(description=f"encrypt {shown(status.thread_id)}")
    spaces = [] if threads else _encrypt_memory(app, saver)
    remaining = [r for s in statuses for r in s.remaining] + [r for s in spaces for r in s.remaining]
    left = [s for s in statuses if s.state not in ("encrypted", "empty")]
    busy = [s.namespace for s in spaces if s.state != "encrypted"]
    if app.out.json:
        app.out.emit_json(
            {
                "encrypted_threads": [s.thread_id for s in statuses if s.state == "encrypted"],
                "migrated_threads": [s.thread_id for s in statuses if s.migrated],
                "left": [{"thread_id": s.thread_id, "state": s.state, "storage_class": s.storage_class} for s in left],
                "deleted_versions": sum(s.deleted for s in statuses) + sum(s.deleted for s in spaces),
                "encrypted_namespaces": [list(s.namespace) for s in spaces if s.state == "encrypted"],
                "migrated_namespaces": [list(s.namespace) for s in spaces if s.items],
                "memory_items": sum(s.items for s in spaces),
                "busy_namespaces": [list(ns) for ns in busy],
                "remaining": remaining_json(remaining),
            }
        )
    else:
        migrated = [s.thread_id for s in statuses if s.migrated]
        done = sum(1 for s in statuses if s.state == "encrypted")
        deleted = sum(s.deleted for s in statuses)
        app.out.message(
            f"encrypted {plural(done, 'thread')}, {len(migrated)} rewritten now ({plural(deleted, 'version')} and "
            f"delete markers of plaintext removed){': ' + shown_list(migrated) if migrated else ''}"
        )
        for s in left:
            why = (
                f"archived in {s.storage_class} without encryption: restore it (restore), then run encrypt again"
                if s.state == "cold" else "written to throughout: run encrypt again"
            )
            app.out.message(f"left {shown(s.thread_id)}: {why}")
        if spaces:
            rewritten = sum(s.items for s in spaces)
            app.out.message(
                f"memory: encrypted {plural(len(spaces) - len(busy), 'namespace')}, {plural(rewritten, 'item')} "
                f"rewritten now ({plural(sum(s.deleted for s in spaces), 'version')} and delete markers of plaintext removed)"
            )
        for ns in busy:
            app.out.message(f"left namespace {'.'.join(shown(label) for label in ns)}: written to throughout: run encrypt again")
        print_remaining(app, remaining)
    return EXIT_FAILED if remaining or left or busy else EXIT_OK


def _encrypt_memory(app: App, saver: Any) -> list[Any]:
    """The memory store on the saver's prefix (``S3Store.from_saver``), its namespaces
    encrypted; none registered: one read, nothing else."""
    from s3_saver import S3Store

    store = S3Store.from_saver(saver)
    spaces = []
    with app.out.progress("encrypt memory", total=None) as tracker:
        for status in store.encrypt_namespaces():
            spaces.append(status)
            tracker.advance(description=f"encrypt namespace {'.'.join(shown(label) for label in status.namespace)}")
    return spaces


# -- archive, restore --------------------------------------------------------------------
def _status_rows(statuses: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (s.thread_id, s.state, s.storage_class or "", s.checkpoints, human_bytes(s.live_bytes), human_bytes(s.size), s.key or "")
        for s in statuses
    ]


STATUS_COLUMNS = ("thread", "state", "class", "checkpoints", "live bytes", "archive bytes", "key")


@click.command("archive", short_help='Archive threads, one cold object each.')
@click.argument("threads", nargs=-1)
@click.option(
    "--idle", type=Duration(), default=None, metavar="DURATION", help="Every live thread whose latest checkpoint is older (e.g. 30d)."
)
@click.option("--limit", type=click.IntRange(min=1), metavar="N", default=None, help="With --idle: at most this many threads.")
@click.option(
    "--budget", type=click.IntRange(min=1), metavar="N", default=1000, show_default=True,
    help="With --idle: read at most this many activity entries.",
)
@click.option("--backfill", is_flag=True, help="With --idle: first give threads written before activity entries one.")
@click.option("--class", "storage_class", type=click.Choice(ARCHIVE_CLASSES), default="GLACIER_IR", show_default=True)
@pass_app
def archive_command(
    app: App, threads: tuple[str, ...], idle: timedelta | None, limit: int | None, budget: int, backfill: bool, storage_class: str
) -> None:
    """Pack THREADs (or every thread idle for --idle) into one compressed object each, in a cold class."""
    if bool(threads) == (idle is not None):
        raise click.UsageError("give THREADs or --idle DURATION (not both)")
    if (limit is not None or backfill) and idle is None:
        raise click.UsageError("--limit and --backfill go with --idle")
    if idle is not None:
        _archive_idle(app, idle, limit, budget, backfill, storage_class)
        return
    saver = app.saver()
    for thread in threads:
        if not thread_exists(app, thread):
            raise not_found(app, thread)
    statuses = []
    with app.out.progress("archive", total=len(threads)) as tracker:
        for thread in threads:
            status = saver.archive_thread(thread, storage_class=storage_class)
            statuses.append(status)
            tracker.advance(nbytes=status.live_bytes, description=f"archive {shown(thread)}")
    if app.out.json:
        app.out.emit_json({"archived": [dataclasses.asdict(s) for s in statuses]})
    elif statuses:
        app.out.print(app.out.table(STATUS_COLUMNS, _status_rows(statuses), numeric=("checkpoints", "live bytes", "archive bytes")))
    else:
        app.out.message("no thread to archive")


def _archive_idle(app: App, idle: timedelta, limit: int | None, budget: int, backfill: bool, storage_class: str) -> None:
    """One ``saver.archive_idle`` run, and what it left: the archived threads,
    then whether to run again (``more``) and the backfill's progress."""
    report = app.saver().archive_idle(idle, storage_class=storage_class, limit=limit, budget=budget, backfill=backfill)
    if app.out.json:
        app.out.emit_json(
            {
                "archived": [dataclasses.asdict(s) for s in report],
                "more": report.more,
                "examined": report.examined,
                "dropped": report.dropped,
                "backfilled": report.backfilled,
                "backfill_more": report.backfill_more,
            }
        )
        return
    if report:
        app.out.print(app.out.table(STATUS_COLUMNS, _status_rows(list(report)), numeric=("checkpoints", "live bytes", "archive bytes")))
    else:
        app.out.message("no thread to archive")
    if backfill:
        more = "; more to backfill: run again" if report.backfill_more else "; backfill done"
        app.out.message(f"backfilled {plural(report.backfilled, 'thread')}{more}")
    app.out.message(
        f"read {report.examined} activity {'entry' if report.examined == 1 else 'entries'}, dropped {report.dropped} stale"
        + ("; more to do: run again" if report.more else "; nothing more to do")
    )


@click.command("restore", short_help='Bring an archived thread back to live objects.')
@click.argument("thread")
@click.option(
    "--days",
    type=click.IntRange(min=1),
    metavar="N",
    default=3,
    show_default=True,
    help="How long S3 keeps a cold archive's readable copy.",
)
@click.option("--tier", type=click.Choice(["Standard", "Bulk", "Expedited"]), default="Standard", show_default=True)
@pass_app
def restore_command(app: App, thread: str, days: int, tier: str) -> None:
    """Bring an archived THREAD back to live objects (from GLACIER/DEEP_ARCHIVE: run again once S3 restored it)."""
    saver = app.saver()
    if not thread_exists(app, thread):
        raise not_found(app, thread)
    status = saver.restore_thread(thread, days=days, tier=tier)
    if app.out.json:
        app.out.emit_json(dataclasses.asdict(status))
        return
    if status.state == "restoring":
        app.out.message(
            f"thread {thread!r}: S3 is restoring its archive ({status.storage_class}, tier {tier}); run restore again later"
        )
    elif status.key is None:
        app.out.message(f"thread {thread!r} is live (it was not archived)")
    else:
        app.out.message(
            f"thread {thread!r} is live again: {plural(status.checkpoints, 'checkpoint')}, "
            f"{human_bytes(status.live_bytes)} written back from {status.key} ({status.storage_class}, deleted)"
        )


# -- export, import ----------------------------------------------------------------------
@click.command("export", short_help='Write a thread to a file.')
@click.argument("thread")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@pass_app
def export_command(app: App, thread: str, file: str) -> None:
    """Write THREAD as one archive (the format import reads) to FILE (- for stdout)."""
    from s3_saver import ConfigurationError

    to_stdout = file == "-"
    if to_stdout and sys.stdout.isatty():
        raise click.UsageError("refusing to write an export (binary) to a terminal: give a FILE or redirect stdout")
    if to_stdout and app.out.json:
        raise click.UsageError("--json describes the export on stdout: give a FILE, not -")
    saver = app.saver()
    with app.out.progress("export", total=1) as tracker:
        tracker.update(description=f"export {shown(thread)}")
        try:
            data = saver.export_thread(thread)
        except ConfigurationError:
            if not thread_exists(app, thread):
                raise not_found(app, thread) from None
            raise
        if to_stdout:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            _write_whole(file, data)
        tracker.advance(nbytes=len(data))
    if app.out.json:
        app.out.emit_json({"thread_id": thread, "file": file, "bytes": len(data)})
    elif to_stdout:
        app.out.note(f"exported thread {thread!r}: {len(data):,} bytes")
    else:
        app.out.message(f"exported thread {thread!r} to {file}: {len(data):,} bytes")


def _write_whole(path: str, data: bytes) -> None:
    """``data`` into ``path``, which holds either its old bytes or all the new ones: a run
    ended mid-write (Ctrl-C ends the process at once, a crash) never leaves a cut export
    under the name, only a ``.partial`` file beside it."""
    directory, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


@click.command("import", short_help='Write a thread from an export file.')
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--as", "as_thread", metavar="THREAD", help="Import under this thread id (default: the exported thread's).")
@pass_app
def import_command(app: App, file: str, as_thread: str | None) -> None:
    """Write a thread from an export FILE (- for stdin) into an empty thread."""
    saver = app.saver()
    with app.out.progress("import", total=1) as tracker:
        if file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(file, "rb") as source:
                data = source.read()
        tracker.update(nbytes=len(data), description=f"import {shown(as_thread or file)}")
        thread = saver.import_thread(data, thread_id=as_thread)
        tracker.advance()
    if app.out.json:
        app.out.emit_json({"thread_id": thread, "file": file, "bytes": len(data)})
    else:
        app.out.message(f"imported thread {thread!r} from {file}: {len(data):,} bytes")


COMMANDS = [copy_command, prune_command, delete_command, erase_command, encrypt_command, archive_command, restore_command, export_command, import_command]
