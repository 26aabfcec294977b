"""``migrate``: copy threads between LangGraph checkpoint savers (SQLite, Postgres, S3Saver).

``--from`` and ``--to`` take the URLs of [open_saver()][s3_saver.open_saver]; the one
left out is the store the global options configure (``--bucket``, ``--table``...).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import click

from s3_saver._migrate.urls import mask
from s3_saver.cli._app import App, pass_app
from s3_saver.cli._messages import url_words
from s3_saver.cli._output import human_bytes, shown

URL_FORMS = "sqlite:///file.db, postgresql://user:password@host/db, s3://bucket/prefix?table=T&region=R&endpoint_url=U"


@click.command("migrate", short_help='Copy threads between checkpoint savers.')
@click.option("--from", "source_url", metavar="URL", help=f"Saver read from ({URL_FORMS}); default the global options' store.")
@click.option("--to", "target_url", metavar="URL", help="Saver written to (same forms); default the global options' store.")
@click.option(
    "--thread", "threads", multiple=True, metavar="THREAD", help="Only this thread (repeat for more); default every thread."
)
@click.option("--no-verify", is_flag=True, help="Do not read each thread back from the target to compare it.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Threads copied at once (each thread's checkpoints stay in order on one worker).",
)
@pass_app
def migrate_command(
    app: App, source_url: str | None, target_url: str | None, threads: tuple[str, ...], no_verify: bool, workers: int
) -> None:
    """Copy every checkpoint and pending write of the source's threads into the target, then verify.

    Resumable: run it again after an interruption and it skips what the target holds.

    Every saver this command opens (SQLite, PostgreSQL, S3Saver) may be used from several
    threads, so threads are copied 4 at a time by default: S3 and DynamoDB requests wait on
    the network, and 4 threads in flight overlap those waits (SQLite and PostgreSQL take
    turns on their one connection)."""
    if not source_url and not target_url:
        raise click.UsageError("give --from URL or --to URL (the other defaults to the store of --bucket/--table)")
    from s3_saver import ConfigurationError, migrate, open_saver

    def opened(url: str, **options: Any) -> Any:
        try:
            return stack.enter_context(open_saver(url, **options))
        except ConfigurationError as exc:  # in the URL's words: its parameters, not the global options
            exc.args = (url_words(str(exc)), *exc.args[1:])
            raise

    with ExitStack() as stack:
        # The source is only read: a SQLite file that is not there is an error, not an empty database.
        source = opened(source_url, create=False) if source_url else app.saver()
        target = opened(target_url) if target_url else app.saver()
        with app.out.progress("migrate", unit="checkpoints") as tracker:

            def on_progress(step: Any) -> None:
                tracker.update(done=step.done, total=step.total, nbytes=step.bytes, description=f"migrate {shown(step.thread_id)}")

            report = migrate(
                source,
                target,
                thread_ids=list(threads) or None,
                verify=not no_verify,
                on_progress=on_progress,
                workers=workers,
            )
    where = {"from": mask(source_url or _describe(app)), "to": mask(target_url or _describe(app))}
    if app.out.json:
        app.out.emit_json({**where, **_fields(report)})
        return
    rows = [
        (
            report.threads,
            report.checkpoints,
            report.writes,
            report.skipped,
            human_bytes(report.bytes),
            report.verified if not no_verify else "off",
            f"{report.seconds:.1f}",
        )
    ]
    columns = ("threads", "checkpoints", "writes", "skipped", "bytes", "verified", "seconds")
    app.out.message(f"from {where['from']}")
    app.out.message(f"to   {where['to']}")
    app.out.print(app.out.table(columns, rows, numeric=columns))


def _describe(app: App) -> str:
    query = f"?table={app.table}" if app.table else ""
    return f"s3://{app.bucket}/{app.prefix or ''}{query}"


def _fields(report: Any) -> dict[str, Any]:
    names = ("threads", "checkpoints", "writes", "skipped", "bytes", "verified", "seconds")
    return {name: getattr(report, name) for name in names}


COMMANDS = [migrate_command]
