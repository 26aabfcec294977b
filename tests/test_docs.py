"""The README's Python examples run as written, against the moto server.

Every ```python block of README.md is a complete program. Each one runs in a fresh
namespace with only ``AWS_ENDPOINT_URL`` pointing at moto (the blocks never name an
endpoint), so a README edit that breaks an example fails here. Blocks that define a
Lambda ``handler`` are invoked the way Lambda would: twice, and for async ones under
two separate ``asyncio.run`` loops, with no "Unclosed client session" allowed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)

# The README has this many ```python blocks (sync, async, Lambda interrupt, Lambda async).
# A renamed fence or a dropped example must not make this file pass with nothing to run.
EXPECTED_BLOCKS = 4


def _blocks() -> list[tuple[int, str]]:
    """(line of the block's first code line in README.md, code), in README order."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


BLOCKS = _blocks()


def _kind(code: str) -> str:
    if "def handler(" not in code:
        return "program"
    if "async def main(" in code:
        return "async handler"
    if "interrupt(" in code and "Command(resume=" in code:
        return "interrupt handler"
    return "unknown handler"


def test_readme_python_blocks_are_found() -> None:
    assert len(BLOCKS) >= EXPECTED_BLOCKS, f"found {len(BLOCKS)} ```python blocks in README.md"
    kinds = [_kind(code) for _, code in BLOCKS]
    assert "interrupt handler" in kinds, kinds
    assert "async handler" in kinds, kinds
    for _, code in BLOCKS:
        assert "moto" not in code.lower() and "endpoint" not in code.lower(), code


@pytest.fixture
def aws_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the environment a user would have: the default names, one endpoint variable."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name in ("CHECKPOINT_BUCKET", "CHECKPOINT_TABLE", "AWS_REGION"):
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


def _exec_block(line: int, code: str) -> dict[str, Any]:
    # Padding keeps README line numbers in tracebacks; dont_inherit keeps this file's
    # `from __future__ import annotations` out of the block, as in a user's own file.
    compiled = compile("\n" * (line - 1) + code, str(README), "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": f"readme_block_line_{line}"}
    exec(compiled, namespace)
    return namespace


def _check_interrupt_handler(handler: Any) -> None:
    first = handler({"thread_id": "order-7", "request": "refund 40 EUR"}, None)
    assert first == {"waiting": True, "question": "Approve refund 40 EUR?", "decision": None}
    second = handler({"thread_id": "order-7", "resume": "approved"}, None)
    assert second == {"waiting": False, "question": None, "decision": "approved"}


def _check_async_handler(handler: Any) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # a Lambda runtime calls the handler outside any loop
    first = handler({"thread_id": "chat-1", "note": "hello"}, None)
    second = handler({"thread_id": "chat-1", "note": "again"}, None)
    assert first == {"notes": ["hello", "seen 1 note(s)"]}
    assert second == {"notes": ["hello", "seen 1 note(s)", "again", "seen 3 note(s)"]}


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line: int, code: str, aws_env: str, capfd: pytest.CaptureFixture[str]) -> None:
    kind = _kind(code)
    assert kind != "unknown handler", "a new handler pattern in README.md: add a check for it here"
    with _no_unclosed_sessions(capfd):
        namespace = _exec_block(line, code)
        try:
            if kind == "interrupt handler":
                _check_interrupt_handler(namespace["handler"])
            elif kind == "async handler":
                _check_async_handler(namespace["handler"])
        finally:
            saver = namespace.get("saver")
            if saver is not None:
                saver.close()
            namespace.clear()  # drop the saver, so unclosed async clients would be reported
