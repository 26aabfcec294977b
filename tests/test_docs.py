"""The README's and the documentation site's code blocks run as written, and the site builds.

Every fenced block of README.md and docs/**/*.md is checked by its language:

- ```python: a complete program. Each one runs in a fresh namespace with only
  ``AWS_ENDPOINT_URL`` pointing at the moto server (the blocks never name an endpoint), on
  an emptied moto, so a docs edit that breaks an example fails here. Blocks that define a
  Lambda ``handler`` are invoked the way Lambda would: twice, with a context object, and for
  async ones under two separate ``asyncio.run`` loops, with no "Unclosed client session"
  allowed.
- ```json and ```yaml: parsed (``langgraph.json``, policies).
- ```console: transcripts of the command line, captured against a moto server on the threads
  tests/cli_support.py writes (their ids and times are of that run). They are not run here:
  tests/test_cli.py runs every command and checks its output. What is checked here is that
  every ``$ langgraph-s3-saver ...`` line parses with the command line's own parser (the
  subcommand and each option exist), so a renamed option cannot stay in the docs.
- ```bash: install and ``make`` commands only (asserted). Not run: they install packages or
  start the suite itself.
- ```text: diagrams (the key layout). Not code.

A fence with no language, or another language, fails: no block is skipped silently.
EXPECTED_BLOCKS pins the number of blocks of each kind, so a renamed fence or a dropped
example cannot make this file pass with less to run. The last test builds the site with
``mkdocs build --strict`` (broken links, missing anchors, unresolvable API names fail).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import shlex
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A fence may be indented (inside a list item); its closing fence has the same indentation.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE)

# The blocks of each kind in README.md and docs/. Adding or removing one means changing
# this count too: a block that stops being found must not pass as "nothing to run".
EXPECTED_BLOCKS = {"python": 13, "json": 2, "yaml": 0, "console": 16, "bash": 5, "text": 3}
LANGUAGES = set(EXPECTED_BLOCKS)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository, as in the test ids
    line: int  # line of the block's first code line in its page
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("body")) + 1
            code = textwrap.dedent(m.group("body"))
            found.append(Block(str(path.relative_to(REPO)), line, m.group("lang"), code))
    return found


BLOCKS = _blocks()


def _of(lang: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang]


def _kind(code: str) -> str:
    if "def handler(" not in code:
        return "program"
    if "async def main(" in code:
        return "async handler"
    if "interrupt(" in code and "Command(resume=" in code:
        return "interrupt handler"
    if "saver.deadline(" in code:
        return "deadline handler"
    return "unknown handler"


def test_every_block_is_found_and_has_a_known_language() -> None:
    langs = Counter(b.lang for b in BLOCKS)
    unknown = [b.id for b in BLOCKS if b.lang not in LANGUAGES]
    assert not unknown, f"fences without a language this test checks: {unknown}"
    assert {lang: langs.get(lang, 0) for lang in LANGUAGES} == EXPECTED_BLOCKS
    kinds = [_kind(b.code) for b in _of("python")]
    for kind in ("interrupt handler", "async handler", "deadline handler"):
        assert kind in kinds, kinds
    for block in _of("python"):
        assert "moto" not in block.code.lower() and "endpoint" not in block.code.lower(), block.id


def test_every_fence_is_closed() -> None:
    # An unclosed or mis-indented fence swallows the text after it, and FENCE finds nothing there.
    for path in PAGES:
        opening = [line for line in path.read_text(encoding="utf-8").splitlines() if line.lstrip().startswith("```")]
        assert len(opening) % 2 == 0, f"{path.relative_to(REPO)}: an odd number of ``` lines"
        assert len(opening) // 2 == sum(1 for b in BLOCKS if b.page == str(path.relative_to(REPO)))


# -- python -------------------------------------------------------------------------------


@pytest.fixture
def aws_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the environment a user would have: the default names, one endpoint variable."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name in ("CHECKPOINT_BUCKET", "CHECKPOINT_TABLE", "CHECKPOINT_PREFIX", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    return endpoint


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _no_unclosed_sessions(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Fail if aiohttp reports a session or connector left open (warning, log or stderr)."""
    handler = _Records()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
            gc.collect()  # aiohttp reports from __del__
    finally:
        logger.removeHandler(handler)
    reports = [str(w.message) for w in caught] + handler.messages + [capfd.readouterr().err]
    leaks = [r for r in reports if "Unclosed" in r]
    assert not leaks, leaks


def _exec_block(block: Block) -> dict[str, Any]:
    # Padding keeps the page's line numbers in tracebacks; dont_inherit keeps this file's
    # `from __future__ import annotations` out of the block, as in a user's own file.
    compiled = compile("\n" * (block.line - 1) + block.code, str(REPO / block.page), "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": f"docs_block_{block.id}"}
    exec(compiled, namespace)
    return namespace


class _LambdaContext:
    """The part of Lambda's context object the handlers use: 5 minutes left."""

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def _check_interrupt_handler(handler: Any) -> None:
    first = handler({"thread_id": "order-7", "request": "refund 40 EUR"}, _LambdaContext())
    assert first == {"waiting": True, "question": "Approve refund 40 EUR?", "decision": None}
    second = handler({"thread_id": "order-7", "resume": "approved"}, _LambdaContext())
    assert second == {"waiting": False, "question": None, "decision": "approved"}


def _check_async_handler(handler: Any) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # a Lambda runtime calls the handler outside any loop
    first = handler({"thread_id": "chat-1", "note": "hello"}, _LambdaContext())
    second = handler({"thread_id": "chat-1", "note": "again"}, _LambdaContext())
    assert first == {"notes": ["hello", "seen 1 note(s)"]}
    assert second == {"notes": ["hello", "seen 1 note(s)", "again", "seen 3 note(s)"]}


def _check_deadline_handler(handler: Any) -> None:
    assert handler({"thread_id": "visitor-1"}, _LambdaContext()) == {"visits": 1}
    assert handler({"thread_id": "visitor-1"}, _LambdaContext()) == {"visits": 2}


CHECKS = {
    "interrupt handler": _check_interrupt_handler,
    "async handler": _check_async_handler,
    "deadline handler": _check_deadline_handler,
}


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: b.id)
def test_python_block_runs(block: Block, aws_env: str, capfd: pytest.CaptureFixture[str]) -> None:
    kind = _kind(block.code)
    assert kind != "unknown handler", f"a new handler pattern in {block.id}: add a check for it here"
    with _no_unclosed_sessions(capfd):
        namespace = _exec_block(block)
        try:
            if kind in CHECKS:
                CHECKS[kind](namespace["handler"])
        finally:
            saver = namespace.get("saver")
            if saver is not None:
                saver.close()
            namespace.clear()  # drop the saver, so unclosed async clients would be reported


# -- json, yaml, bash ---------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("json") + _of("yaml"), ids=lambda b: b.id)
def test_data_block_parses(block: Block) -> None:
    document = json.loads(block.code) if block.lang == "json" else yaml.safe_load(block.code)
    assert isinstance(document, dict), block.id
    if "checkpointer" in document:  # langgraph.json: the saver's module and attribute
        module, _, attribute = document["checkpointer"]["path"].partition(":")
        assert module.startswith("s3_saver") and attribute, document


@pytest.mark.parametrize("block", _of("bash"), ids=lambda b: b.id)
def test_bash_block_only_installs_or_makes(block: Block) -> None:
    for line in block.code.splitlines():
        command = line.split("#", 1)[0].strip()
        assert command.startswith(("pip install ", "make ")), f"{block.id}: {line!r} is neither run nor an install"


# -- console ------------------------------------------------------------------------------


def _cli_commands(block: Block) -> list[list[str]]:
    """The argument lists of every `langgraph-s3-saver` run on a `$ ` line, pipes split."""
    runs = []
    for line in block.code.splitlines():
        if not line.startswith("$ "):
            continue
        words = shlex.split(line[2:])
        segment: list[str] = []
        for word in [*words, "|"]:
            if word != "|":
                segment.append(word)
                continue
            if segment and segment[0] == "langgraph-s3-saver":
                runs.append(segment[1:])
            segment = []
    return runs


def test_console_blocks_show_the_command_line() -> None:
    assert all(_cli_commands(b) for b in _of("console") if "$ " in b.code)
    assert sum(len(_cli_commands(b)) for b in _of("console")) >= 30


@pytest.mark.parametrize("block", _of("console"), ids=lambda b: b.id)
def test_console_commands_parse(block: Block, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from s3_saver.cli._app import cli

    monkeypatch.setenv("CHECKPOINT_BUCKET", "my-checkpoints")
    monkeypatch.chdir(tmp_path)
    for args in _cli_commands(block):
        # The files a transcript names (an export that `import` reads back) exist, empty:
        # options that must name an existing file check that while parsing.
        for word in args:
            if re.fullmatch(r"[\w-]+\.\w+", word):
                (tmp_path / word).touch()
        # make_context parses and checks the options without running the command.
        group = cli.make_context("langgraph-s3-saver", list(args))
        rest = [*group._protected_args, *group.args]
        name, command, sub_args = cli.resolve_command(group, rest)
        assert command is not None, f"{block.id}: no subcommand {name!r}"
        command.make_context(name, sub_args, parent=group)


# -- the site -----------------------------------------------------------------------------


def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "api" / "index.html").read_text().count("S3Saver") > 10
