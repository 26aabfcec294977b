"""What the command line prints: rich tables and values on stdout, ``--json`` documents,
one-line messages, and progress bars on stderr (only on a terminal).

Results go to stdout, progress and errors to stderr, so ``langgraph-s3-saver ... | jq``
and ``> file`` get the results alone.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime, timezone
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

# Width of tables written to a pipe or a file (no terminal to measure): wide enough for a
# row of ids and times on one line, so `grep` and `cut` see whole rows. COLUMNS wins.
PIPE_WIDTH = 200
UNBOUNDED = 100_000


def to_jsonable(value: Any) -> Any:
    """``value`` as JSON types: LangChain messages and other pydantic models through
    ``model_dump``, dataclasses (``Interrupt``, ``Send``...) field by field, datetimes in
    ISO 8601, anything else as its ``repr``."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf": JSON has no such numbers (strict parsers refuse NaN)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return to_jsonable(dump())
        except Exception:  # a model that cannot dump itself: its repr below
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        try:
            return to_jsonable(to_json())
        except Exception:
            pass
    return repr(value)


_NAMED_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shown(text: str) -> str:
    """``text`` (a thread id, a key) as a terminal shows it: as is when every character
    prints; otherwise quoted the way shells read it back (``$'chat\\nann'``), so that a
    newline, tab, escape sequence or bidirectional override can neither break a table
    nor act on the terminal, and the id can be pasted into the next command.

    ``--json`` documents carry the text unchanged.
    """
    if text.isprintable() and not text.startswith("$'"):
        return text
    out = []
    for char in text:
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")  # not \\x: a shell's \\xHH is a byte, not a character
        else:
            out.append(f"\\U{ord(char):08x}")
    return "$'" + "".join(out) + "'"


def shown_list(names: Sequence[str], limit: int = 5) -> str:
    """``a, b, c and 2 more``: the first ``limit`` names, each as `shown()` gives it."""
    listed = ", ".join(shown(name) for name in names[:limit])
    return listed + (f" and {len(names) - limit} more" if len(names) > limit else "")


def plural(count: int, noun: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def human_bytes(size: int | None) -> str:
    """``1,234`` bytes as ``1.2 kB`` (decimal units, as S3's console)."""
    return "" if size is None else decimal(int(size))


def short_time(value: str | datetime | None) -> str:
    """An ISO time or datetime as ``YYYY-MM-DD HH:MM:SS`` in UTC (``""`` for None)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S")


class Output:
    """Where results, messages and progress go, by the global ``--json``/``--no-progress``.

    Args:
        json_mode: Results are JSON documents on stdout (tables and messages are not printed).
        progress: Progress bars wanted (they are shown only when stderr is a terminal).
    """

    def __init__(self, *, json_mode: bool = False, progress: bool = True) -> None:
        self.json = json_mode
        self._piped = not (sys.stdout.isatty() or os.environ.get("COLUMNS"))
        # Piped, a table is as wide as its longest row (one line per row, for grep and cut);
        # everything else wraps at PIPE_WIDTH.
        self.console = Console(highlight=False, width=UNBOUNDED if self._piped else None)
        self.err = Console(stderr=True, highlight=False)
        self.show_progress = progress and not json_mode and _is_terminal(sys.stderr)

    # -- results ---------------------------------------------------------------------
    def emit_json(self, document: Any) -> None:
        """One JSON document on stdout."""
        sys.stdout.write(json.dumps(to_jsonable(document), indent=2, ensure_ascii=False, allow_nan=False) + "\n")
        sys.stdout.flush()

    def print(self, *renderables: RenderableType | str) -> None:
        """Rich renderables on stdout; a plain string is printed as is (no markup)."""
        for item in renderables:
            if isinstance(item, str):
                item = Text(item)
            self.console.print(item, width=PIPE_WIDTH if self._piped and not isinstance(item, Table) else None)

    def message(self, text: str) -> None:
        """A one-line result in human mode (``--json`` documents carry the same facts)."""
        if not self.json:
            self.console.print(Text(text))

    def note(self, text: str) -> None:
        """A line on stderr that is not the result (e.g. beside binary output on stdout)."""
        self.err.print(Text(text))

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        *,
        title: str | None = None,
        caption: str | None = None,
        numeric: Sequence[str] = (),
    ) -> Table:
        """A table of plain cells (no rich markup is read from them); ``numeric`` columns align right.

        Text cells go through `shown()`: one line per row, whatever characters an id holds
        (callers pass ids in ``title`` and ``caption`` through it). Cells given as rich
        ``Text`` are drawn as they are."""
        table = Table(
            title=title,
            caption=caption,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            title_justify="left",
            caption_justify="left",
        )
        for name in columns:
            table.add_column(name, justify="right" if name in numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(cell if isinstance(cell, Text) else Text("" if cell is None else shown(str(cell))) for cell in row))
        return table

    # -- progress --------------------------------------------------------------------
    @contextmanager
    def progress(self, description: str, total: int | None = None, unit: str = "threads") -> Iterator[Tracker]:
        """A progress bar on stderr for the block (a tracker that draws nothing when
        stderr is not a terminal, or with ``--json``/``--no-progress``)."""
        if not self.show_progress:
            yield Tracker(None, None)
            return
        bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),  # an id is text, never markup
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            BytesColumn(),
            RateColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.err,
            refresh_per_second=8,
        )
        _live.append(bar)
        try:
            with bar:
                task = bar.add_task(description, total=total, unit=unit, bytes=None)
                tracker = Tracker(bar, task)
                yield tracker
                # The last frame: the whole operation (a total never told is what was done).
                total_now = bar.tasks[0].total
                bar.update(task, description=description, total=tracker.done if total_now is None else total_now)
        finally:
            _live.remove(bar)


_live: list[Progress] = []


def live_progress() -> bool:
    """Whether a progress bar is drawn right now (it hides the terminal's cursor)."""
    return bool(_live)


def _is_terminal(stream: Any) -> bool:
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


class Tracker:
    """Updates one progress bar: items done of a total (None: not known yet) and bytes."""

    def __init__(self, bar: Progress | None, task: Any) -> None:
        self._bar = bar
        self._task = task
        self.done = 0
        self.bytes = 0

    def update(
        self,
        *,
        done: int | None = None,
        total: int | None = None,
        nbytes: int | None = None,
        description: str | None = None,
    ) -> None:
        """Set what is known so far (absolute values, as the saver's callbacks give them)."""
        if done is not None:
            self.done = done
        if nbytes is not None:
            self.bytes = nbytes
        if self._bar is None:
            return
        fields: dict[str, Any] = {"completed": self.done}
        if total is not None:
            fields["total"] = total
        if nbytes is not None:
            fields["bytes"] = nbytes
        if description is not None:
            fields["description"] = description
        self._bar.update(self._task, **fields)

    def advance(self, items: int = 1, nbytes: int = 0, *, description: str | None = None) -> None:
        """One more item done (and its bytes)."""
        self.update(done=self.done + items, nbytes=self.bytes + nbytes if nbytes else None, description=description)


class BytesColumn(ProgressColumn):
    """Bytes moved so far (blank while an operation reports none)."""

    def render(self, task: Task) -> Text:
        size = task.fields.get("bytes")
        return Text(decimal(size) if size else "", style="progress.filesize")


class RateColumn(ProgressColumn):
    """Items per second and bytes per second since the start."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        if not elapsed:
            return Text("", style="progress.data.speed")
        rate = f"{task.completed / elapsed:.1f}/s"
        size = task.fields.get("bytes")
        if size:
            rate += f" {decimal(int(size / elapsed))}/s"
        return Text(rate, style="progress.data.speed")
