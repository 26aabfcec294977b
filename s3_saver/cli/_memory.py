"""Long-term memory (``S3Store``): ``memory namespaces``, ``memory show``, ``memory delete``,
``memory export``, ``memory import``, ``memory gc``.

The store is the saver's (``S3Store.from_saver``): the same bucket, table, prefix, index
mode, serializer (``--serde``) and checks as the thread commands. A namespace is given as
``--ns LABEL`` repeated, or dotted (``--ns users.ann``): LangGraph refuses a ``.`` in a
label, so splitting on it is exact; namespaces are shown dotted, each label as ``shown``
writes an id.

Each command is a function registered on ``memory_group``: a further subcommand is one
more ``@memory_group.command`` here.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from s3_saver.cli._app import (
    EXIT_BROKEN,
    EXIT_OK,
    EXIT_ORPHANS,
    App,
    NotFoundError,
    pass_app,
)
from s3_saver.cli._inspect import render_value
from s3_saver.cli._lifecycle import _write_whole
from s3_saver.cli._maintain import DEFAULT_GRACE, SAFE_GRACE
from s3_saver.cli._output import human_bytes, plural, short_time, shown
from s3_saver.cli._params import Duration, format_duration

if TYPE_CHECKING:
    from s3_saver import S3Store

_PAGE = 1000  # namespaces per list_namespaces call


def store_of(app: App) -> S3Store:
    """The store on the saver of the global options (its clients, checks and serializer)."""
    from s3_saver import S3Store

    return S3Store.from_saver(app.saver())


def namespace_of(labels: tuple[str, ...]) -> tuple[str, ...]:
    """``--ns`` values as a namespace: each split on ``.`` (``users.ann`` is two labels).

    Raises:
        click.BadParameter: An empty label (``--ns ''``, ``a..b``) or one holding NUL,
            which LangGraph refuses in any namespace (a usage error).
    """
    namespace = tuple(label for value in labels for label in value.split("."))
    for label in namespace:
        if not label or "\x00" in label:
            what = "an empty label" if not label else f"a label with a NUL byte ({shown(label)})"
            raise click.BadParameter(f"{dotted(namespace)} holds {what}: LangGraph refuses it", param_hint="'--ns'")
    return namespace


def dotted(namespace: tuple[str, ...]) -> str:
    return ".".join(shown(label) for label in namespace)


def _item_name(app: App, namespace: tuple[str, ...], key: str) -> str:
    return f"item {key!r} of namespace {dotted(namespace)} in {app.store_name()}"


def ns_option(required: bool, help: str) -> Any:
    return click.option("--ns", "labels", multiple=True, required=required, metavar="LABEL", help=help)


@click.group("memory", short_help="Long-term memory (S3Store): namespaces, items, export, import, gc.")
def memory_group() -> None:
    """Long-term memory: the items LangGraph's store (S3Store) keeps on the same bucket, table
    and prefix as the threads. Namespaces are given as --ns LABEL, repeated or dotted."""


# -- namespaces --------------------------------------------------------------------------
@memory_group.command("namespaces", short_help="List namespaces.")
@ns_option(False, "Only namespaces under this prefix (repeat, or dotted: a.b).")
@click.option("--max-depth", type=click.IntRange(min=1), metavar="N", help="Namespaces cut to their first N labels.")
@pass_app
def namespaces_command(app: App, labels: tuple[str, ...], max_depth: int | None) -> None:
    """List the namespaces that hold items, in order, all of them."""
    prefix = namespace_of(labels)
    store = store_of(app)
    listed: list[tuple[str, ...]] = []
    while True:
        page = store.list_namespaces(prefix=prefix or None, max_depth=max_depth, limit=_PAGE, offset=len(listed))
        listed += page
        if len(page) < _PAGE:
            break
    if app.out.json:
        app.out.emit_json({"namespaces": [list(ns) for ns in listed]})
        return
    if not listed:
        app.out.message("no namespaces" + (f" under {dotted(prefix)}" if prefix else ""))
        return
    for namespace in listed:
        app.out.print(dotted(namespace))


# -- show --------------------------------------------------------------------------------
@memory_group.command("show", short_help="Show an item.")
@ns_option(True, "The item's namespace (repeat, or dotted: a.b).")
@click.argument("key")
@pass_app
def show_command(app: App, labels: tuple[str, ...], key: str) -> None:
    """An item's value and times. Reading it does not refresh its TTL."""
    namespace = namespace_of(labels)
    item = store_of(app).get(namespace, key, refresh_ttl=False)
    if item is None:
        raise NotFoundError(f"no {_item_name(app, namespace, key)}")
    doc = {
        "namespace": list(item.namespace),
        "key": item.key,
        "created_at": item.created_at,
        "updated_at": item.updated_at,
        "value": item.value,
    }
    if app.out.json:
        app.out.emit_json(doc)
        return
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("namespace", Text(dotted(item.namespace)))
    head.add_row("key", Text(shown(item.key)))
    head.add_row("created", Text(short_time(item.created_at) + " UTC"))
    head.add_row("updated", Text(short_time(item.updated_at) + " UTC"))
    app.out.print(Group(head, Text(""), Text("value", style="bold underline"), render_value(item.value)))


# -- delete ------------------------------------------------------------------------------
@memory_group.command("delete", short_help="Delete an item.")
@ns_option(True, "The item's namespace (repeat, or dotted: a.b).")
@click.argument("key")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def delete_command(app: App, labels: tuple[str, ...], key: str, yes: bool) -> None:
    """Delete one item."""
    namespace = namespace_of(labels)
    store = store_of(app)
    if store.get(namespace, key, refresh_ttl=False) is None:
        raise NotFoundError(f"no {_item_name(app, namespace, key)}: nothing to delete")
    app.confirm(f"delete item {key!r} of namespace {dotted(namespace)}", yes)
    store.delete(namespace, key)
    if app.out.json:
        app.out.emit_json({"deleted": {"namespace": list(namespace), "key": key}})
    else:
        app.out.message(f"deleted item {key!r} of namespace {dotted(namespace)}")


# -- export, import ----------------------------------------------------------------------
@memory_group.command("export", short_help="Write the items under a namespace prefix to a file.")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@ns_option(False, "Only the items under this namespace prefix (repeat, or dotted: a.b).")
@pass_app
def export_command(app: App, file: str, labels: tuple[str, ...]) -> None:
    """Write every item (of the namespaces under --ns) to FILE (- for stdout): the format
    `memory import` reads, in any bucket, prefix or index mode."""
    to_stdout = file == "-"
    if to_stdout and sys.stdout.isatty():
        raise click.UsageError("refusing to write an export to a terminal: give a FILE or redirect stdout")
    if to_stdout and app.out.json:
        raise click.UsageError("--json describes the export on stdout: give a FILE, not -")
    prefix = namespace_of(labels)
    store = store_of(app)
    with app.out.progress("export", total=1, unit="exports") as tracker:
        data = store.export_memory(prefix)
        if to_stdout:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            _write_whole(file, data)
        tracker.advance(nbytes=len(data))
    items = data.count(b"\n") - 2  # a header line, an end line, one line per item
    under = f" under {dotted(prefix)}" if prefix else ""
    if app.out.json:
        app.out.emit_json({"namespace_prefix": list(prefix), "file": file, "items": items, "bytes": len(data)})
    elif to_stdout:
        app.out.note(f"exported {plural(items, 'item')}{under}: {len(data):,} bytes")
    else:
        app.out.message(f"exported {plural(items, 'item')}{under} to {file}: {len(data):,} bytes")


@memory_group.command("import", short_help="Write the items of an export file.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@pass_app
def import_command(app: App, file: str) -> None:
    """Write the items of an export FILE (- for stdin), with their times and expiry. Items
    there already (same times) are left alone: run it again to finish an import cut short."""
    store = store_of(app)
    with app.out.progress("import", total=1, unit="imports") as tracker:
        if file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(file, "rb") as source:
                data = source.read()
        tracker.update(nbytes=len(data))
        report = store.import_memory(data)
        tracker.advance()
    if app.out.json:
        app.out.emit_json({"file": file, "bytes": len(data), **vars(report)})
        return
    left = [f"{report.unchanged:,} there already"] if report.unchanged else []
    left += [f"{report.expired:,} expired"] if report.expired else []
    app.out.message(
        f"imported {plural(report.written, 'item')} of {plural(report.namespaces, 'namespace')} from {file}"
        + (f" ({', '.join(left)})" if left else "")
        + f": {human_bytes(len(data))}"
    )



# -- gc ------------------------------------------------------------------------------------
@memory_group.command("gc", short_help="Delete value objects no item names (a dry run unless --yes).")
@click.option(
    "--older-than",
    type=Duration(),
    default=format_duration(DEFAULT_GRACE),
    show_default=True,
    help="Grace period: a value object younger than this may belong to a put still in flight.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    metavar="N",
    help="Keys listed in this run; the next run goes on from where it stopped.",
)
@click.option("--yes", is_flag=True, help="Delete (without it, a dry run: what would be deleted).")
@click.option("--force", is_flag=True, help=f"Delete with a grace period under {format_duration(SAFE_GRACE)}.")
@click.option("-v", "--verbose", is_flag=True, help="List every key.")
@pass_app
def gc_command(app: App, older_than: timedelta, limit: int, yes: bool, force: bool, verbose: bool) -> int:
    """Delete the value objects no item names, past the grace period (a dry run unless
    --yes): what a put cut short before its commit left, or an item DynamoDB's TTL deleted.
    A run lists at most --limit keys, from where the last run stopped.

    A dry run exits 4 when it finds such objects, with 32 added when a namespace's items
    cannot be read (its folder is left alone); with --yes, 0 once deleted."""
    if yes and older_than < SAFE_GRACE and not force:
        # A put names its value object within ten minutes of writing it (else it copies it
        # first): a grace period under SAFE_GRACE may delete the object of a put in flight.
        raise click.UsageError(
            f"--older-than {format_duration(older_than)} is shorter than a put may hold its value object "
            f"({format_duration(SAFE_GRACE)}): objects of puts in flight would be deleted. "
            "Stop every writer first and add --force, or use a longer grace period"
        )
    store = store_of(app)
    with app.out.progress("memory gc" if yes else "memory gc (dry run)", total=1, unit="runs") as tracker:
        report = store.collect_garbage(older_than=older_than, limit=limit, dry_run=not yes)
        tracker.advance()
    keys = report.deleted if yes else report.garbage
    code = EXIT_OK if yes else (EXIT_ORPHANS if report.garbage else EXIT_OK) | (EXIT_BROKEN if report.broken else EXIT_OK)
    if app.out.json:
        app.out.emit_json(
            {
                "examined": report.examined,
                "namespaces": report.namespaces,
                "deleted" if yes else "would_delete": list(keys),
                "delete_bytes": report.bytes,
                "in_flight": list(report.in_flight),
                "broken": [{"folder": folder, "reason": reason} for folder, reason in report.broken],
                "finished": report.finished,
                "dry_run": not yes,
                "exit_code": code,
            }
        )
        return code
    if verbose:
        for key in keys:
            app.out.print(Text(key))
    for folder, reason in report.broken:
        app.out.message(f"left alone: {folder}: {reason}")
    young = f", {len(report.in_flight)} younger than {format_duration(older_than)}" if report.in_flight else ""
    app.out.message(
        f"{plural(report.examined, 'key')} listed, {plural(report.namespaces, 'namespace')} read: "
        f"{plural(len(report.garbage), 'value object')} no item names{young}"
    )
    verb = "deleted" if yes else "would delete"
    hint = "" if yes or not keys else "; run again with --yes to delete"
    app.out.message(f"{verb} {plural(len(keys), 'object')} ({human_bytes(report.bytes)}){hint}")
    if not report.finished:
        app.out.message(f"more keys to list: the next run goes on from here (--limit {limit})")
    return code


COMMANDS = [memory_group]
