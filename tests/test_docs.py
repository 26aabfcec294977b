"""The README's and the documentation site's code blocks run as written, and the site builds.

Every fenced block of README.md and docs/**/*.md is checked by its language:

- ```python: a complete program. Each one runs in a fresh namespace with only
  ``AWS_ENDPOINT_URL`` pointing at the moto server (the blocks never name an endpoint). A
  page's programs run in page order on one emptied moto, as a reader who runs them one after
  another sees them, so a docs edit that breaks an example, or an output that holds only on a
  fresh store, fails here. Blocks that define a
  Lambda ``handler`` are invoked the way Lambda would: twice, with a context object, and for
  async ones under two separate ``asyncio.run`` loops, with no "Unclosed client session"
  allowed.
- ```json and ```yaml: parsed (``langgraph.json``, policies).
- ```console: transcripts of the command line (docs/reference/cli.md), captured against a moto
  server on the threads tests/cli_support.py writes. They run here, in page order, on one
  fresh store: each `$ langgraph-s3-saver ...` line (pipes included) in this process through
  the command line's own entry point, with stdin and stdout pipes as in a script; its output
  must equal the transcript's line for line once numbers, ids, times and the endpoint are
  masked, and its exit code the `echo $?` that follows (else 0). What the store held when a
  transcript was captured (the threads, a crashed write's object, a SQLite database to
  migrate) is made just before the first command that shows it. A pipe into another
  program (`| jq`) checks that the command line printed JSON; jq is not run. The progress
  bar block is not a command.
- ```bash: install, ``make`` and local set-up commands (not run: they install packages, start
  the suite itself, or start a local server; this file starts moto itself), and runs of the
  command line (a deploy step's ``setup``), which run where the page shows them.
- ```text: diagrams (the key layout). Not code. A ```text block titled "Output" right after a
  program is what that program prints: compared line by line, checkpoint ids masked.

A fence with no language, or another language, fails: no block is skipped silently. Every
code line fits the page at 1280 px, and so does every table (CODE_WIDTH, TABLE_BOX_PX). User
pages name no issue, commit or test file; the errors page names every exported exception; the
API page's headings nest.
EXPECTED_BLOCKS pins the number of blocks of each kind, so a renamed fence or a dropped
example cannot make this file pass with less to run. test_site_builds_strict builds the site
with ``mkdocs build --strict`` (broken links, missing anchors, unresolvable API names fail).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import no_unclosed_sessions

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A fence may be indented (inside a list item); its closing fence has the same indentation.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE)

# The blocks of each kind in README.md and docs/. Adding or removing one means changing
# this count too: a block that stops being found must not pass as "nothing to run".
EXPECTED_BLOCKS = {"python": 25, "json": 5, "yaml": 0, "console": 17, "bash": 10, "text": 12}
LANGUAGES = set(EXPECTED_BLOCKS)
# The command line's page: its console transcripts run, in page order (test_cli_transcripts_run).
CLI_PAGE = "docs/reference/cli.md"


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository, as in the test ids
    line: int  # line of the block's first code line in its page
    lang: str
    code: str
    info: str = ""  # the rest of the fence line, e.g. title="Output"

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
            found.append(Block(str(path.relative_to(REPO)), line, m.group("lang"), code, m.group("info").strip()))
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
    if "store=store" in code:
        return "memory handler"
    return "unknown handler"


def test_every_block_is_found_and_has_a_known_language() -> None:
    langs = Counter(b.lang for b in BLOCKS)
    unknown = [b.id for b in BLOCKS if b.lang not in LANGUAGES]
    assert not unknown, f"fences without a language this test checks: {unknown}"
    assert {lang: langs.get(lang, 0) for lang in LANGUAGES} == EXPECTED_BLOCKS
    kinds = [_kind(b.code) for b in _of("python")]
    for kind in ("interrupt handler", "async handler", "deadline handler", "memory handler"):
        assert kind in kinds, kinds
    for block in _of("python"):
        assert "moto" not in block.code.lower() and "endpoint" not in block.code.lower(), block.id


# The bucket and the table an example names (literals, or the defaults of CHECKPOINT_BUCKET and
# CHECKPOINT_TABLE): a reader who runs the pages in order must never put two buckets on one table.
_BUCKET_NAME = re.compile(r'(?:CHECKPOINT_BUCKET",\s*|S3Saver\(\s*)"([^"]+)"')
_TABLE_NAME = re.compile(r'table\s*=\s*(?:os\.environ\.get\("CHECKPOINT_TABLE",\s*)?"([^"]+)"')
_CLI_PAIR = re.compile(
    r"CHECKPOINT_BUCKET=(\S+) CHECKPOINT_TABLE=(\S+)|s3://([^/?\s]+)/\S*\?table=([^&\s]+)|--bucket (\S+) --table (\S+)"
)


def test_each_table_of_the_docs_belongs_to_one_bucket() -> None:
    """A table's prefix belongs to one bucket (TableOwnedError): the examples give each
    bucket a table of its own, as their readers should."""
    owners: dict[str, set[str]] = {}
    for block in BLOCKS:
        pairs = [(m[0] or m[2] or m[4], m[1] or m[3] or m[5]) for m in _CLI_PAIR.findall(block.code)]
        buckets = set(_BUCKET_NAME.findall(block.code))
        if len(buckets) == 1:
            pairs += [(next(iter(buckets)), table) for table in _TABLE_NAME.findall(block.code)]
        for bucket, table in pairs:
            owners.setdefault(table, set()).add(bucket)
    assert owners and "langgraph-checkpoints" in owners, owners
    assert {t: b for t, b in owners.items() if len(b) > 1} == {}


def test_every_fence_is_closed() -> None:
    # An unclosed or mis-indented fence swallows the text after it, and FENCE finds nothing there.
    for path in PAGES:
        opening = [line for line in path.read_text(encoding="utf-8").splitlines() if line.lstrip().startswith("```")]
        assert len(opening) % 2 == 0, f"{path.relative_to(REPO)}: an odd number of ``` lines"
        assert len(opening) // 2 == sum(1 for b in BLOCKS if b.page == str(path.relative_to(REPO)))


# -- python -------------------------------------------------------------------------------


@pytest.fixture
def aws_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the environment a user would have: the default names, one endpoint variable, and the
    region as AWS_REGION alone (what the quick start sets; boto3 itself reads only AWS_DEFAULT_REGION)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    # The master key a LocalKey() user keeps in their environment (the encryption guide).
    monkeypatch.setenv("S3_SAVER_LOCAL_KEY", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
    for name in ("CHECKPOINT_BUCKET", "CHECKPOINT_TABLE", "CHECKPOINT_PREFIX", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    return endpoint


def _exec_block(block: Block) -> dict[str, Any]:
    # Padding keeps the page's line numbers in tracebacks; dont_inherit keeps this file's
    # `from __future__ import annotations` out of the block, as in a user's own file.
    compiled = compile("\n" * (block.line - 1) + block.code, str(REPO / block.page), "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": f"docs_block_{block.id}"}
    exec(compiled, namespace)
    return namespace


class _LambdaContext:
    """The part of Lambda's context object the handlers use: 5 minutes left, or ``millis``."""

    def __init__(self, millis: int = 300_000) -> None:
        self.millis = millis

    def get_remaining_time_in_millis(self) -> int:
        return self.millis


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
    # Less than the handler's margin left: the step still runs, with no time for a retry.
    assert handler({"thread_id": "visitor-1"}, _LambdaContext(400)) == {"visits": 3}


def _check_memory_handler(handler: Any) -> None:
    # Two threads of one user: the second sees what the first stored; another user sees none of it.
    first = handler({"thread_id": "chat-1", "user": "ann", "said": "likes tea"}, _LambdaContext())
    assert first == {"known": ["likes tea"]}
    second = handler({"thread_id": "chat-2", "user": "ann", "said": "lives in Oslo"}, _LambdaContext())
    assert second == {"known": ["likes tea", "lives in Oslo"]}
    other = handler({"thread_id": "chat-3", "user": "bob", "said": "likes coffee"}, _LambdaContext())
    assert other == {"known": ["likes coffee"]}


CHECKS = {
    "interrupt handler": _check_interrupt_handler,
    "async handler": _check_async_handler,
    "deadline handler": _check_deadline_handler,
    "memory handler": _check_memory_handler,
}


# A reader runs a page's programs one after another, on one store: a later example meets what
# an earlier one wrote (the quick start's async example continues the sync example's thread).
# So each page's programs run here in page order on one emptied store, each output compared
# with what that reader sees. A bash block that runs the command line (the Lambda guide's
# deploy step, `langgraph-s3-saver setup`) runs too, where the page shows it.
PROGRAM_PAGES = sorted({b.page for b in _of("python")})


def _page_steps(page: str) -> list[Block]:
    return [b for b in BLOCKS if b.page == page and (b.lang == "python" or (b.lang == "bash" and _cli_lines(b)))]


def _cli_lines(block: Block) -> list[tuple[dict[str, str], list[str]]]:
    """The command-line runs of a bash block: (the VAR=value words before it, its arguments)."""
    runs = []
    for line in block.code.splitlines():
        words = shlex.split(line.split("#", 1)[0])
        assignments = {}
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if words and words[0] == "langgraph-s3-saver":
            runs.append((assignments, words[1:]))
    return runs


@pytest.mark.parametrize("page", PROGRAM_PAGES)
def test_page_programs_run_in_page_order(page: str, aws_env: str, capfd: pytest.CaptureFixture[str]) -> None:
    for block in _page_steps(page):
        if block.lang == "bash":
            for assignments, args in _cli_lines(block):
                code, _, err = _cli(args, assignments)
                assert code == 0, f"{block.id}: langgraph-s3-saver {shlex.join(args)}: {err.decode()}"
            continue
        _run_program(block, capfd)


def _run_program(block: Block, capfd: pytest.CaptureFixture[str]) -> None:
    kind = _kind(block.code)
    assert kind != "unknown handler", f"a new handler pattern in {block.id}: add a check for it here"
    with no_unclosed_sessions(capfd) as captured:
        namespace = _exec_block(block)
        try:
            if kind in CHECKS:
                CHECKS[kind](namespace["handler"])
        finally:
            saver = namespace.get("saver")
            if saver is not None:
                saver.close()
            namespace.clear()  # drop the saver, so unclosed async clients would be reported
    shown = _output_of(block)
    if shown is not None:
        assert _masked(captured["out"]) == _masked(shown.code), f"{shown.id}: the output shown is not what {block.id} prints"


def _output_of(block: Block) -> Block | None:
    """The ```text title="Output" block that follows a program on its page, if any."""
    later = [b for b in BLOCKS if b.page == block.page and b.line > block.line]
    following = later[0] if later else None
    return following if following is not None and following.lang == "text" and 'title="Output"' in following.info else None


_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _masked(text: str) -> list[str]:
    """Lines, with checkpoint ids (uuid6, new at every run) as <id>."""
    return [_IDS.sub("<id>", line).rstrip() for line in text.strip().splitlines()]


# -- json, yaml, bash ---------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("json") + _of("yaml"), ids=lambda b: b.id)
def test_data_block_parses(block: Block) -> None:
    document = json.loads(block.code) if block.lang == "json" else yaml.safe_load(block.code)
    assert isinstance(document, dict), block.id
    if "checkpointer" in document:  # langgraph.json: the saver's module and attribute
        # langgraph-api resolves a path without "/" by splitting at its last dot: the
        # `module:attr` spelling does not load there.
        path = document["checkpointer"]["path"]
        module, _, attribute = path.rpartition(".")
        assert ":" not in path and module.startswith("s3_saver"), document
        assert callable(getattr(importlib.import_module(module), attribute)), document
    if "Statement" in document:  # an IAM policy: the template's in one index mode, KMS aside
        assert _policy_mode(document) is not None, f"{block.id} is not SaverPolicy in any IndexMode"


def _shape(statements: list[dict[str, Any]]) -> dict[str, tuple[frozenset[str], frozenset[str], str]]:
    """Each statement by Sid: its actions, resources and condition (the KMS ones left out)."""

    return {
        st["Sid"]: (
            frozenset(_as_list(st["Action"])),
            frozenset(_as_list(st["Resource"])),
            json.dumps(st.get("Condition"), sort_keys=True),
        )
        for st in statements
        if not st["Sid"].endswith("Encryption")
    }


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _policy_mode(document: dict[str, Any]) -> str | None:
    """The IndexMode whose SaverPolicy ``document`` is (for the bucket and table it names,
    no prefix), or None."""
    from infra_support import Stack, load_template

    resources = [r for st in document["Statement"] for r in _as_list(st["Resource"])]
    bucket = next(r for r in resources if r.startswith("arn:aws:s3:::")).removeprefix("arn:aws:s3:::").split("/")[0]
    table_arn = next((r for r in resources if r.startswith("arn:aws:dynamodb:")), "<no table>")
    physical = {
        "Bucket": {"Ref": bucket, "Arn": f"arn:aws:s3:::{bucket}"},
        "Table": {"Ref": table_arn.rpartition("/")[2], "Arn": table_arn},
    }
    template = load_template()
    for mode in template["Parameters"]["IndexMode"]["AllowedValues"]:
        policy = Stack(template, {"IndexMode": mode}, physical=physical).properties("SaverPolicy")["PolicyDocument"]
        if _shape(document["Statement"]) == _shape(policy["Statement"]):
            return mode
    return None


def test_iam_page_shows_the_policy_of_each_index_mode() -> None:
    from infra_support import load_template

    policies = [json.loads(b.code) for b in _of("json") if b.page == "docs/reference/iam.md"]
    modes = [_policy_mode(p) for p in policies if "Statement" in p]
    assert sorted(modes) == sorted(load_template()["Parameters"]["IndexMode"]["AllowedValues"]), modes


# Not run: they install packages, start the suite itself, or start a local server and point
# the environment at it (Installation's "Running locally"; this file does the same with moto).
# A run of the command line (a deploy step's `setup`) is run, by test_page_programs_run_in_page_order.
RUN_LOCALLY = ("pip install ", "make ", "moto_server ", "export AWS_")


@pytest.mark.parametrize("block", _of("bash"), ids=lambda b: b.id)
def test_bash_block_only_installs_or_makes(block: Block) -> None:
    runs = len(_cli_lines(block))
    commands = [c for c in (line.split("#", 1)[0].strip() for line in block.code.splitlines()) if c]
    for command in commands:
        assert command.startswith(RUN_LOCALLY) or "langgraph-s3-saver " in command, (
            f"{block.id}: {command!r} is neither an install, a make target, a local set-up nor a run of the command line"
        )
    assert runs == sum("langgraph-s3-saver " in c for c in commands), f"{block.id}: a command-line run this file would not run"
    assert not runs or block.page in PROGRAM_PAGES, f"{block.id}: runs only on a page with programs"


# -- console ------------------------------------------------------------------------------


def _pipeline(line: str) -> list[list[str]]:
    """A shell line's commands, split at its pipes: [["langgraph-s3-saver", ...], ["jq", ...]]."""
    commands: list[list[str]] = [[]]
    for word in shlex.split(line):
        if word == "|":
            commands.append([])
        else:
            commands[-1].append(word)
    return commands


def _cli_commands(block: Block) -> list[list[str]]:
    """The argument lists of every `langgraph-s3-saver` run on a `$ ` line."""
    lines = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
    return [words[1:] for line in lines for words in _pipeline(line) if words[0] == "langgraph-s3-saver"]


def test_console_blocks_are_transcripts_of_the_cli_page() -> None:
    """Every console block with a `$ ` line is on the page whose transcripts run below; the
    one block without is the progress bar as a terminal shows it (nothing to run)."""
    with_commands = [b for b in _of("console") if "$ " in b.code]
    assert {b.page for b in with_commands} == {CLI_PAGE}
    assert all(_cli_commands(b) for b in with_commands)
    assert [b.id for b in _of("console") if "$ " not in b.code and "━" not in b.code] == []


# -- the site -----------------------------------------------------------------------------

# The widest code line a page shows whole. Measured in headless Chromium (Debian's chromium 156)
# on the site `make docs` builds (mkdocs-material 9.8 and docs/stylesheets/extra.css), at a
# 1280x800 window: a code block at the top level of a page gets a 656 px box, 80.2 characters
# of its 13.6 px monospace font (0.6 em a character: Roboto Mono, or the DejaVu Sans Mono a
# browser without web fonts falls back to). A 1240 px window fits 80 too, 1220 px 78; below
# 1220 px the table of contents folds away and the box widens. Docstring examples show in the
# API page's admonitions, in a smaller font (97 fit): they are held to the same 80.
# Re-measure after a change of the theme, its fonts or the stylesheet:
#     apt-get install -y chromium && make docs && .venv/bin/python tests/render_docs.py
# prints the characters a top-level block fits and each code block or table that overflows.
CODE_WIDTH = 80
# The command line's transcripts show what it prints: its tables are as wide as their longest
# row and its messages are one line, so they may be wider. They scroll, with a scrollbar that
# is always drawn and a shadow at the edge that hides text (extra.css).
MAY_SCROLL = {"console"}
STYLESHEET = REPO / "docs" / "stylesheets" / "extra.css"


def _docstring_blocks() -> list[Block]:
    """The fenced examples of the package's docstrings, which the API page renders."""
    found = []
    for path in sorted((REPO / "s3_saver").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("body")) + 1
            found.append(Block(str(path.relative_to(REPO)), line, m.group("lang"), textwrap.dedent(m.group("body"))))
    return found


def test_code_lines_fit_the_page_at_1280px() -> None:
    blocks = [b for b in BLOCKS + _docstring_blocks() if b.lang not in MAY_SCROLL]
    assert len(blocks) > 30 and any(b.page.startswith("s3_saver/") for b in blocks)
    too_wide = [
        f"{b.page}:{b.line + i}: {len(line)} characters"
        for b in blocks
        for i, line in enumerate(b.code.splitlines())
        if len(line) > CODE_WIDTH
    ]
    assert too_wide == [], f"code lines over {CODE_WIDTH} characters are cut off at 1280 px"


def test_what_may_be_wider_scrolls_visibly() -> None:
    css = re.sub(r"/\*.*?\*/", "", STYLESHEET.read_text(), flags=re.DOTALL)
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", css))
    code = next(body for selector, body in rules.items() if selector.strip() == ".md-typeset pre > code")
    # The theme's own scrollbar-color would make Chrome ignore the ::-webkit-scrollbar rules.
    assert "scrollbar-color: auto" in code and "local" in code and "scroll" in code, code
    assert any("pre > code::-webkit-scrollbar-track" in selector for selector in rules), rules


# Tables: the browser wraps a cell at its spaces, so a table overflows only when its columns'
# narrowest widths add up to more than its box. Measured as above at 1280 px: a table's box is
# 720 px; the theme pads each cell 16 px on either side and makes a column at least 100 px
# (its `th` min-width). A column's narrowest width is its widest unbreakable run: 7.2 px a
# character of text at the tables' 12.8 px (7.8 bold, in the header row), 6.6 px a character
# of code plus 6 px of its padding. This estimate was 0.98x to 1.49x of the widths Chromium
# laid out for the site's 35 tables, and found the 4 that overflowed: it is held 20 px short.
TABLE_BOX_PX = 720
TABLE_MARGIN_PX = 20
_TABLE_ROW = re.compile(r"^\|.*\|[ \t]*$")
_TABLE_RULE = re.compile(r"^\|(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*$")


def _tables(text: str) -> list[list[list[str]]]:
    """The pipe tables of a page outside its code blocks: rows of cells (the rule row left out)."""
    text = FENCE.sub("", text)
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if _TABLE_ROW.match(line):
            rows.append(line)
            continue
        if len(rows) >= 2 and _TABLE_RULE.match(rows[1]):
            tables.append([_cells(row) for i, row in enumerate(rows) if i != 1])
        rows = []
    return tables


def _cells(row: str) -> list[str]:
    cells, cell, in_code = [], "", False
    for char in row.strip()[1:-1]:
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*cells, cell.strip()]


def _narrowest_px(cell: str, bold: bool = False) -> float:
    """The widest run of a cell that the browser does not break (it breaks at spaces)."""
    cell = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell).replace("**", "")
    widest = run = 0.0
    for i, part in enumerate(re.split(r"`", cell)):
        in_code = i % 2 == 1
        for j, word in enumerate(part.split(" ")):
            if j > 0:
                widest, run = max(widest, run), 0.0
            run += len(word) * (6.6 if in_code else 7.8 if bold else 7.2) + (6 if in_code and j == 0 else 0)
    return max(widest, run)


def _table_px(rows: list[list[str]]) -> float:
    columns = max(len(row) for row in rows)
    return sum(
        max(100.0, 32 + max(_narrowest_px(row[c], bold=r == 0) for r, row in enumerate(rows) if c < len(row)))
        for c in range(columns)
    )


def test_tables_fit_the_page_at_1280px() -> None:
    site_pages = [p for p in PAGES if p.is_relative_to(REPO / "docs")]
    tables = [(p.relative_to(REPO), rows) for p in site_pages for rows in _tables(p.read_text(encoding="utf-8"))]
    assert len(tables) > 30, len(tables)
    too_wide = [
        f"{page}: {' | '.join(rows[0])[:70]}: {_table_px(rows):.0f} px"
        for page, rows in tables
        if _table_px(rows) > TABLE_BOX_PX - TABLE_MARGIN_PX
    ]
    assert too_wide == [], f"tables wider than their {TABLE_BOX_PX} px box at 1280 px hide their last columns"


# -- what user pages say ------------------------------------------------------------------

# Pages for the project's developers, which may speak of its history and its test files.
DEVELOPER_PAGES = {"docs/contributing.md", "docs/changelog.md", "docs/concepts/design-notes.md"}
_HISTORY = re.compile(r"\bissues? #?\d+|\btests/[\w/]*\.py\b|\btest_\w+\.py\b|\bmain at [0-9a-f]{7}", re.IGNORECASE)


def test_user_pages_speak_of_the_product_not_its_history() -> None:
    user_pages = [p for p in PAGES if str(p.relative_to(REPO)) not in DEVELOPER_PAGES]
    assert len(user_pages) > 20
    found = [
        f"{p.relative_to(REPO)}:{n}: {m.group(0)}"
        for p in user_pages
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for m in _HISTORY.finditer(line)
    ]
    assert found == [], "an issue number, a commit or a test file on a user page"


def test_every_exported_exception_is_on_the_errors_page() -> None:
    import s3_saver

    exported = [name for name in s3_saver.__all__ if isinstance(getattr(s3_saver, name), type)]
    exceptions = [name for name in exported if issubclass(getattr(s3_saver, name), BaseException)]
    assert "S3SaverError" in exceptions and len(exceptions) > 10
    page = (REPO / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    assert [name for name in exceptions if f"`{name}`" not in page] == []


def test_api_page_headings_nest() -> None:
    """Each `::: name` block's heading sits below the section it is in: at the section's own
    level it would end that section in the table of contents and take the next names along."""
    plugins = yaml.safe_load((REPO / "mkdocs.yml").read_text())["plugins"]
    handler = next(p["mkdocstrings"] for p in plugins if isinstance(p, dict) and "mkdocstrings" in p)
    default = handler["handlers"]["python"]["options"]["heading_level"]
    section, checked, wrong = 0, 0, []
    lines = (REPO / "docs" / "reference" / "api.md").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#"):
            section = len(line) - len(line.lstrip("#"))
        elif line.startswith("::: "):
            following = lines[i + 1 :]
            end = next((n for n, o in enumerate(following) if o and not o[0].isspace()), len(following))
            options = "\n".join(following[:end])
            own = re.search(r"^\s+heading_level: (\d)", options, re.MULTILINE)
            level = int(own.group(1)) if own else default
            checked += 1
            if "show_root_heading: false" not in options and level <= section:
                wrong.append(f"{line[4:]}: level {level} in a level-{section} section")
    assert checked > 50 and wrong == []



def test_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # material's notice is not a warning of ours
    )
    assert result.returncode == 0, result.stdout + result.stderr
    page = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert page.count("S3Saver") > 10
    # What a reader sees: no raw Sphinx role, no private name or default, no private base.
    text = re.sub(r"<[^>]+>", "", page)
    assert not re.findall(r":(?:meth|class|func|attr|mod|exc):`", text)
    assert not re.findall(r"\b(?:DEFAULT_(?!REGION)[A-Z_]+|ThreadLifecycle|Where\(|error_code|translate\()", text)
    assert not re.findall(r"Bases:[^\n]*\b(?:ThreadLifecycle|Archival|Regions)\b", text)
    assert not re.findall(r"s3_saver\._\w+", text), re.findall(r"s3_saver\._\w+", text)[:5]


# -- console: the command line's transcripts, run --------------------------------------

# Numbers, ids, times and endpoints differ from run to run; what a transcript shows is the
# rest: which lines, columns, words and messages, in which order.
_VOLATILE = [
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?(\+00:00)?"), "<time>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"(?<![\w-])[0-9a-f]{32,}(?![\w-])"), "<hex>"),
    (re.compile(r"http://127\.0\.0\.1:\d+"), "<endpoint>"),
    (re.compile(r"\d[\d,]*(\.\d+)?"), "<n>"),
    (re.compile(r"[ \t]+"), " "),
]


def _normalized(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        for pattern, replacement in _VOLATILE:
            line = pattern.sub(replacement, line)
        line = line.strip()
        if line and set(line) != {"─"}:  # table rules are as wide as the widest row
            lines.append(line)
    return lines


@dataclass
class _Step:
    line: str  # the command as shown, after `$ `
    shown: str  # what the transcript shows it print
    code: int  # its exit code: 0, or what a following `echo $?` shows


def _steps(block: Block) -> list[_Step]:
    steps: list[_Step] = []
    for raw in block.code.splitlines():
        if raw.startswith("$ echo $?"):
            steps[-1].code = -1  # the next line is the code
        elif raw.startswith("$ "):
            steps.append(_Step(raw[2:], "", 0))
        elif steps and steps[-1].code == -1:
            steps[-1].code = int(raw)
        elif steps:
            steps[-1].shown += raw + "\n"
    return steps


def _cli(args: list[str], env: dict[str, str], stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    """The command line in this process, with pipes on every stream (nothing is a terminal)."""
    from click.testing import CliRunner

    from s3_saver.cli._group import run

    runner = CliRunner()
    with runner.isolation(input=stdin, env=env) as (out, err, _):
        code = run(args, "langgraph-s3-saver")
        return code, out.getvalue(), err.getvalue()


def _populate(endpoint: str) -> None:
    """The threads the transcripts were captured on: chat-ann answered and fanned out,
    chat-bob and chat-cid waiting at the interrupt (runs <user>-1, ann-2).

    The listing is newest first, by the second; threads created in the same second go by
    id. Created in reverse order, they list as shown whether or not a second ends between."""
    from cli_support import populate

    from s3_saver import S3Saver

    saver = S3Saver("my-checkpoints", table="langgraph-checkpoints", endpoint_url=endpoint, region_name="us-east-1")
    populate(saver, users=("cid", "bob", "ann"))
    saver.close()


def _crashed_write(endpoint: str) -> None:
    """An object a write left behind when it crashed before its commit."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.put_object(Bucket="my-checkpoints", Key="live/chat-ann/=/checkpoints/1f0c2d3e-crashed-write", Body=b"x" * 812)


def _sqlite_database(endpoint: str) -> None:
    """checkpoints.db: three threads (legacy-1 among them) of another saver to migrate."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, StateGraph

    builder = StateGraph(dict)
    builder.add_node("count", lambda state: {"n": state.get("n", 0) + 1})
    builder.add_edge(START, "count")
    connection = sqlite3.connect("checkpoints.db", check_same_thread=False)  # graphs run nodes on a pool
    graph = builder.compile(checkpointer=SqliteSaver(connection))
    for thread in ("legacy-1", "legacy-2", "legacy-3"):
        graph.invoke({"n": 0}, {"configurable": {"thread_id": thread}})
    connection.close()


def _memories(endpoint: str) -> None:
    """Long-term memory beside the threads: Ann's preferences and a note, Bob's preferences."""
    from s3_saver import S3Store

    store = S3Store("my-checkpoints", table="langgraph-checkpoints", endpoint_url=endpoint, region_name="us-east-1")
    store.put(("users", "ann"), "preferences", {"food": "likes tea", "language": "en"})
    store.put(("users", "ann", "notes"), "oslo", {"text": "lives in Oslo"}, ttl=30 * 24 * 60)
    store.put(("users", "bob"), "preferences", {"food": "coffee"})
    store.close()


def _unnamed_value(endpoint: str) -> None:
    """A value object a put left when it was cut short before its item was written."""
    import boto3

    from s3_saver._format.memory.names import node_id

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    key = f"memory/n/{node_id(('users', 'ann'))}/@v/{'5e' * 16}"
    s3.put_object(Bucket="my-checkpoints", Key=key, Body=b"x" * 70_000)


# What the store held before a transcript's first command, as when it was captured.
_BEFORE = {
    "langgraph-s3-saver memory namespaces": _memories,
    "langgraph-s3-saver threads": _populate,
    "langgraph-s3-saver verify": _crashed_write,
    "langgraph-s3-saver migrate --from sqlite:///checkpoints.db": _sqlite_database,
    "langgraph-s3-saver memory gc": _unnamed_value,
}


def test_cli_transcripts_run(endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every transcript of the command-line page, in page order, on one store."""
    monkeypatch.chdir(tmp_path)  # export and import write and read files here
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1", "COLUMNS": None}
    env.update(dict.fromkeys(("CHECKPOINT_BUCKET", "CHECKPOINT_TABLE", "CHECKPOINT_PREFIX", "AWS_DEFAULT_REGION")))
    done = set()
    ran = 0
    for block in [b for b in _of("console") if b.page == CLI_PAGE]:
        for step in _steps(block):
            where = f"{block.id}: $ {step.line}"
            if step.line.startswith("export "):
                env.update(word.split("=", 1) for word in shlex.split(step.line)[1:])
                continue
            for prefix, prepare in _BEFORE.items():
                if step.line.startswith(prefix) and prefix not in done:
                    done.add(prefix)
                    prepare(endpoint)
            stdin, shown, codes = b"", b"", []
            for words in _pipeline(step.line):
                if words[0] != "langgraph-s3-saver":
                    # A pipe into another program (jq): the command line's side is JSON.
                    json.loads(stdin)
                    break
                code, out, err = _cli(words[1:], env, stdin)
                codes.append(code)
                shown += err
                stdin = out
            else:
                shown += stdin
                assert _normalized(shown.decode()) == _normalized(step.shown), where
            assert codes and codes[-1] == step.code and set(codes[:-1]) <= {0}, f"{where}: exit {codes}"
            ran += 1
    assert done == set(_BEFORE) and ran >= 30, (done, ran)
