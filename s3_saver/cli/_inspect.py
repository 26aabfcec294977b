"""Reading commands: ``threads``, ``history``, ``show``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Group, RenderableType
from rich.pretty import Pretty
from rich.table import Table
from rich.text import Text

from s3_saver.cli._app import App, NotFoundError, pass_app
from s3_saver.cli._checkpoint import (
    internal_values,
    interrupts,
    next_nodes,
    user_values,
    values_size,
)
from s3_saver.cli._output import human_bytes, short_time, shown
from s3_saver.cli._params import KeyValue


def thread_config(thread_id: str, ns: str | None = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def thread_exists(app: App, thread_id: str) -> bool:
    """Whether the thread has a checkpoint in any namespace (archived threads included)."""
    return any(True for _ in app.saver().list(thread_config(thread_id, None), limit=1))


def not_found(app: App, thread_id: str, checkpoint_id: str | None = None, ns: str = "") -> NotFoundError:
    where = f" (namespace {ns!r})" if ns else ""
    if checkpoint_id and thread_exists(app, thread_id):
        return NotFoundError(f"checkpoint {checkpoint_id!r} not found in thread {thread_id!r}{where}")
    return NotFoundError(f"thread {thread_id!r} has no checkpoints{where} in {app.store_name()}")


# -- threads -----------------------------------------------------------------------------
@click.command("threads", short_help='List threads, newest first.')
@click.option(
    "--filter",
    "filters",
    type=KeyValue(),
    multiple=True,
    help="Latest checkpoint's metadata key=value (value as JSON when it parses).",
)
@click.option("--limit", type=click.IntRange(min=0), metavar="N", default=20, show_default=True, help="Threads per page (0: all).")
@click.option("--before", metavar="THREAD", help="The page after this thread (the previous page's footer).")
@pass_app
def threads_command(app: App, filters: tuple[tuple[str, Any], ...], limit: int, before: str | None) -> None:
    """List threads, newest first, with their latest checkpoint."""
    listed = list(app.saver().list_threads(filter=dict(filters) or None, limit=limit or None, before=before))
    following = listed[-1].thread_id if limit and len(listed) == limit else None
    if app.out.json:
        app.out.emit_json({"threads": [_thread_json(t) for t in listed], "next_before": following})
        return
    rows = [
        (
            t.thread_id,
            short_time(t.created_at),
            t.checkpoint_id,
            short_time(t.ts),
            t.metadata.get("step", ""),
            t.metadata.get("source", ""),
            t.archived or "",
        )
        for t in listed
    ]
    caption = f"next page: --before {shown(following)}" if following else None
    columns = ("thread", "created", "latest checkpoint", "time", "step", "source", "archived")
    if not rows:
        app.out.message("no threads" + (" match the filter" if filters else ""))
        return
    app.out.print(app.out.table(columns, rows, caption=caption, numeric=("step",)))


def _thread_json(t: Any) -> dict[str, Any]:
    return {
        "thread_id": t.thread_id,
        "created_at": t.created_at,
        "checkpoint_id": t.checkpoint_id,
        "ts": t.ts,
        "metadata": t.metadata,
        "archived": t.archived,
    }


# -- history -----------------------------------------------------------------------------
@click.command("history", short_help="List a thread's checkpoints, newest first.")
@click.argument("thread")
@click.option("--ns", default="", metavar="NS", help="Checkpoint namespace (a subgraph's); default the root.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", default=None, help="At most this many checkpoints.")
@click.option("--before", metavar="CHECKPOINT", help="Only checkpoints older than this one.")
@pass_app
def history_command(app: App, thread: str, ns: str, limit: int | None, before: str | None) -> None:
    """A thread's checkpoints, newest first: step, source, next nodes, pending writes, size."""
    saver = app.saver()
    before_config = thread_config(thread, ns, before) if before else None
    listed = list(saver.list(thread_config(thread, ns), before=before_config, limit=limit))
    if not listed and (before is None or not thread_exists(app, thread)):
        raise not_found(app, thread, ns=ns)
    entries = [
        {
            "checkpoint_id": t.checkpoint["id"],
            "parent_checkpoint_id": (t.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
            "ts": t.checkpoint.get("ts"),
            "step": t.metadata.get("step"),
            "source": t.metadata.get("source"),
            "next": next_nodes(t.checkpoint),
            "writes": len(t.pending_writes or ()),
            "size": values_size(saver.serde, t.checkpoint),
            "metadata": t.metadata,
        }
        for t in listed
    ]
    if app.out.json:
        app.out.emit_json({"thread_id": thread, "checkpoint_ns": ns, "checkpoints": entries})
        return
    rows = [
        (e["checkpoint_id"], short_time(e["ts"]), e["step"], e["source"], ", ".join(e["next"]), e["writes"], human_bytes(e["size"]))
        for e in entries
    ]
    columns = ("checkpoint", "time", "step", "source", "next", "writes", "size")
    title = f"thread {shown(thread)}" + (f", namespace {shown(ns)}" if ns else "")
    app.out.print(app.out.table(columns, rows, title=title, numeric=("step", "writes", "size")))


# -- show --------------------------------------------------------------------------------
@click.command("show", short_help='Show a checkpoint: values, writes, interrupts.')
@click.argument("thread")
@click.argument("checkpoint", required=False)
@click.option("--ns", default="", metavar="NS", help="Checkpoint namespace (a subgraph's); default the root.")
@pass_app
def show_command(app: App, thread: str, checkpoint: str | None, ns: str) -> None:
    """One checkpoint (default the latest): metadata, values, pending writes, interrupts."""
    found = app.saver().get_tuple(thread_config(thread, ns, checkpoint))
    if found is None:
        raise not_found(app, thread, checkpoint, ns)
    cp = found.checkpoint
    writes = list(found.pending_writes or ())
    doc = {
        "thread_id": thread,
        "checkpoint_ns": ns,
        "checkpoint_id": cp["id"],
        "parent_checkpoint_id": (found.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
        "ts": cp.get("ts"),
        "metadata": found.metadata,
        "next": next_nodes(cp),
        "values": user_values(cp),
        **internal_values(cp),
        "pending_writes": [{"task_id": w[0], "channel": w[1], "value": w[2]} for w in writes],
        "interrupts": interrupts(writes, live=checkpoint is None),
    }
    if app.out.json:
        app.out.emit_json(doc)
        return
    app.out.print(_render_checkpoint(doc))


def _render_checkpoint(doc: dict[str, Any]) -> RenderableType:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    labels = {"thread": "thread_id", "namespace": "checkpoint_ns", "checkpoint": "checkpoint_id", "parent": "parent_checkpoint_id"}
    for label, key in labels.items():
        if doc.get(key) or key != "checkpoint_ns":
            head.add_row(label, Text(shown(str(doc.get(key) or "-"))))
    head.add_row("time", Text(short_time(doc["ts"]) + " UTC" if doc["ts"] else "-"))
    meta = doc["metadata"] or {}
    head.add_row("step", Text(f"{meta.get('step', '-')} ({meta.get('source', '-')})"))
    head.add_row("next", Text(", ".join(doc["next"]) or "-"))
    head.add_row("metadata", Pretty(meta))
    parts: list[RenderableType] = [head, Text("")]
    values = Table.grid(padding=(0, 2))
    values.add_column(style="bold cyan")
    values.add_column()
    for name, value in doc["values"].items():
        values.add_row(Text(name), render_value(value))
    for name in ("input", "sends"):
        if name in doc:
            values.add_row(Text(f"({name})"), render_value(doc[name]))
    parts += [Text("values", style="bold underline"), values if doc["values"] or "input" in doc else Text("(none)")]
    if doc["pending_writes"]:
        writes = Table("task", "channel", "value", box=None, padding=(0, 2), title_justify="left")
        for w in doc["pending_writes"]:
            writes.add_row(Text(shown(w["task_id"])), Text(shown(w["channel"])), Pretty(w["value"], max_string=200, max_length=10))
        parts += [Text(""), Text(f"pending writes ({len(doc['pending_writes'])})", style="bold underline"), writes]
    if doc["interrupts"]:
        waiting = Table("interrupt", "task", "value", box=None, padding=(0, 2))
        for i in doc["interrupts"]:
            waiting.add_row(Text(shown(str(i["id"] or "-"))), Text(shown(i["task_id"])), render_value(i["value"]))
        parts += [Text(""), Text(f"interrupts ({len(doc['interrupts'])})", style="bold underline"), waiting]
    return Group(*parts)


def _is_message(value: Any) -> bool:
    return hasattr(value, "content") and isinstance(getattr(value, "type", None), str) and hasattr(value, "model_dump")


def render_value(value: Any) -> RenderableType:
    """A channel value: LangChain messages one per line (type, content, tool calls), the rest pretty-printed."""
    if isinstance(value, (list, tuple)) and value and all(_is_message(v) for v in value):
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="magenta")
        grid.add_column()
        for message in value:
            grid.add_row(Text(message.type), _message_body(message))
        return grid
    if _is_message(value):
        return Text.assemble((value.type, "magenta"), " ", _message_body(value))
    return Pretty(value)


def _message_body(message: Any) -> RenderableType:
    content = message.content
    body: RenderableType = Text(content) if isinstance(content, str) else Pretty(content)
    extras = []
    if getattr(message, "name", None):
        extras.append(f"name={message.name}")
    for call in getattr(message, "tool_calls", None) or ():
        extras.append(f"tool call {call.get('name')}({', '.join(f'{k}={v!r}' for k, v in (call.get('args') or {}).items())})")
    if getattr(message, "tool_call_id", None):
        extras.append(f"for tool call {message.tool_call_id}")
    if not extras:
        return body
    return Group(body, Text("  ".join(extras), style="dim"))


COMMANDS = [threads_command, history_command, show_command]
