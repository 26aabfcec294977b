"""Store maintenance: ``setup``, ``verify``, ``gc``, ``rebuild-index``."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

import click

from s3_saver.cli._app import (
    EXIT_BROKEN,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_ORPHANS,
    EXIT_UNINDEXED,
    App,
    NotFoundError,
    pass_app,
)
from s3_saver.cli._output import human_bytes, plural, short_time
from s3_saver.cli._params import Duration, format_duration

# Kinds of StoreProblem, in the order they are shown, with their exit bit (in_flight: none).
KINDS = {"missing": EXIT_MISSING, "broken": EXIT_BROKEN, "orphan": EXIT_ORPHANS, "unindexed": EXIT_UNINDEXED, "in_flight": 0}
DEFAULT_GRACE = timedelta(hours=1)
SAFE_GRACE = timedelta(minutes=15)  # the longest a Lambda runs: below it, gc --yes needs --force


# -- setup -------------------------------------------------------------------------------
@click.command("setup", short_help='Create the bucket and table (idempotent).')
@pass_app
def setup_command(app: App) -> None:
    """Create the bucket (and the table) when missing; check them when present. Idempotent."""
    saver = app.saver(checked=False)
    saver.setup()
    if app.out.json:
        app.out.emit_json({"bucket": app.bucket, "table": app.table or None, "prefix": app.prefix or "", "index": app.mode})
        return
    if app.table:
        app.out.message(f"bucket {app.bucket!r} ready; DynamoDB table {app.table!r} ready (index: dynamodb)")
    else:
        app.out.message(f"bucket {app.bucket!r} ready (index: manifest in the bucket; conditional writes checked)")


# -- verify and gc -----------------------------------------------------------------------
def exit_bits(report: Any) -> int:
    """verify's exit code: one bit per kind of problem found (0: consistent)."""
    code = EXIT_OK
    for problem in report.problems:
        code |= KINDS.get(problem.kind, 0)
    return code


def _report_json(report: Any, code: int, **extra: Any) -> dict[str, Any]:
    counts = Counter(p.kind for p in report.problems)
    return {
        "threads": report.threads,
        "objects": report.objects,
        "bytes": report.bytes,
        "ok": report.ok,
        "counts": {kind: counts.get(kind, 0) for kind in KINDS},
        "problems": [dataclasses.asdict(p) for p in report.problems],
        "notes": list(report.notes),
        **extra,
        "exit_code": code,
    }


def _summary(report: Any) -> str:
    counts = Counter(p.kind for p in report.problems)
    found = ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in KINDS if counts.get(k))
    listed = f"{plural(report.threads, 'thread')}, {plural(report.objects, 'object')} ({human_bytes(report.bytes)})"
    return f"{listed}: " + (
        found if found else "consistent"
    )


def _problems_table(app: App, problems: list[Any], title: str) -> None:
    order = list(KINDS)
    rows = [
        (p.kind, p.thread_id, p.key or "", human_bytes(p.size) if p.modified else "", short_time(p.modified), p.detail)
        for p in sorted(problems, key=lambda p: (order.index(p.kind) if p.kind in order else len(order), p.thread_id, p.key or ""))
    ]
    app.out.print(app.out.table(("kind", "thread", "key", "size", "modified", "detail"), rows, title=title, numeric=("size",)))


def _audit_options(command: Any) -> Any:
    command = click.option(
        "--older-than",
        type=Duration(),
        default=format_duration(DEFAULT_GRACE),
        show_default=True,
        help="Grace period: an unreferenced object younger than this may belong to a write still in flight.",
    )(command)
    return click.argument("threads", nargs=-1, metavar="[THREAD]...")(command)


@click.command("verify", short_help='Compare the index with the bucket.')
@_audit_options
@pass_app
def verify_command(app: App, threads: tuple[str, ...], older_than: timedelta) -> int:
    """Compare the index with the bucket (every thread, or THREADs); change nothing.

    Exit code: 0 consistent, else the sum of 4 orphans, 8 unindexed threads,
    16 missing objects, 32 broken index (writes in flight are shown, never counted)."""
    saver = app.saver()
    with app.out.progress("verify", unit="threads") as tracker:
        report = saver.audit(
            list(threads) or None,
            older_than=older_than,
            progress=lambda done, total, size: tracker.update(done=done, total=total, nbytes=size),
        )
    if report.absent:
        raise NotFoundError(f"no thread {', '.join(map(repr, report.absent))} in the index or the objects of {app.store_name()}")
    code = exit_bits(report)
    if app.out.json:
        app.out.emit_json(_report_json(report, code))
        return code
    if report.problems:
        _problems_table(app, report.problems, "problems")
    for note in report.notes:  # what the bucket's configuration costs: no exit bit
        app.out.message(f"note: {note}")
    app.out.message(_summary(report))
    return code


@click.command("gc", short_help='Delete unreferenced objects (a dry run unless --yes).')
@_audit_options
@click.option("--yes", is_flag=True, help="Delete (without it, a dry run: what would be deleted).")
@click.option(
    "--include-unindexed",
    is_flag=True,
    help="Also the objects of threads the index knows nothing of (rebuild-index restores those).",
)
@click.option("--force", is_flag=True, help=f"Delete with a grace period under {format_duration(SAFE_GRACE)}.")
@click.option("-v", "--verbose", is_flag=True, help="List every key.")
@pass_app
def gc_command(
    app: App, threads: tuple[str, ...], older_than: timedelta, yes: bool, include_unindexed: bool, force: bool, verbose: bool
) -> int:
    """Delete objects no index entry refers to, past the grace period (a dry run unless --yes).

    A dry run exits with verify's bitmask; with --yes, 0 once deleted."""
    if yes and older_than < SAFE_GRACE and not force:
        # A grace period shorter than a write can take deletes the objects of
        # writes in flight (a Lambda runs up to 15 minutes).
        raise click.UsageError(
            f"--older-than {format_duration(older_than)} is shorter than a write can take "
            f"({format_duration(SAFE_GRACE)}): objects of writes in flight would be deleted. "
            "Stop every writer first and add --force, or use a longer grace period"
        )
    saver = app.saver()
    with app.out.progress("gc" if yes else "gc (dry run)", unit="threads") as tracker:
        report = saver.collect_garbage(
            list(threads) or None,
            older_than=older_than,
            dry_run=not yes,
            include_unindexed=include_unindexed,
            progress=lambda done, total, size: tracker.update(done=done, total=total, nbytes=size),
        )
    # What it deleted, or in a dry run would delete.
    keys = report.deleted if yes else report.garbage
    doomed = [p for p in report.problems if p.key in set(keys)]
    size = sum(p.size for p in doomed)
    code = EXIT_OK if yes else exit_bits(report)
    if app.out.json:
        listed = {"deleted" if yes else "would_delete": keys, "delete_bytes": size}
        app.out.emit_json(_report_json(report, code, dry_run=not yes, **listed))
        return code
    if verbose and keys:
        rows = [(p.thread_id, p.key, p.kind, human_bytes(p.size), short_time(p.modified)) for p in doomed if p.key in set(keys)]
        app.out.print(app.out.table(("thread", "key", "kind", "size", "modified"), rows, numeric=("size",)))
    kept = [p for p in report.problems if p.key not in set(keys)]
    if kept and verbose:
        _problems_table(app, kept, "not deleted")
    app.out.message(_summary(report))
    verb = "deleted" if yes else "would delete"
    hint = "" if yes or not keys else "; run again with --yes to delete"
    app.out.message(f"{verb} {plural(len(keys), 'object')} ({human_bytes(size)}){hint}")
    return code


# -- rebuild-index -----------------------------------------------------------------------
@click.command("rebuild-index", short_help='Rebuild the index from the bucket.')
@click.argument("thread", required=False)
@pass_app
def rebuild_index_command(app: App, thread: str | None) -> None:
    """Write the index again from the bucket: for THREAD, or every thread under the prefix.

    Run it while no writer works on those threads."""
    # Not the usual check first: a rebuild of every thread into a new table (its
    # table lost) moves the prefix, which the check would refuse as another
    # table's. The rebuild settles the prefix's mode and the table's owner itself,
    # and lists the bucket (a bucket that is gone is named as such).
    rebuilt = app.saver(checked=False).rebuild_index(thread)
    left = [{"thread_id": u.thread_id, "reason": u.reason, "objects": len(u.keys)} for u in rebuilt.unindexed]
    if app.out.json:
        app.out.emit_json({"thread_id": thread, "checkpoints": int(rebuilt), "unindexed": left})
        return
    what = f"thread {thread!r}" if thread is not None else "every thread under the prefix"
    app.out.message(f"indexed {int(rebuilt)} checkpoints of {what}")
    # With encryption: what could not be opened is named, never indexed.
    for u in left:
        app.out.message(f"left out thread {u['thread_id']!r}: {u['reason']} ({u['objects']} objects)")


COMMANDS = [setup_command, verify_command, gc_command, rebuild_index_command]
