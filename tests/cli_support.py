"""Shared by tests/test_cli.py and tests/test_cli_progress.py: the command line run against
the moto server (in this process, or as a process of its own), and a real LangGraph graph
that fills threads.

The graph has what the CLI must read without it: messages, an interrupt answered
later, a ``Send`` fan-out (PUSH tasks in ``__pregel_tasks``) and pending writes.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, interrupt

from conftest import BUCKET, TABLE

CONSOLE_SCRIPT = Path(sys.executable).parent / "langgraph-s3-saver"
PROG_NAME = "python -m s3_saver"  # what click names the program in usage lines, as run_cli's process
BAR = "━"  # rich's progress bar


class Chat(TypedDict, total=False):
    messages: Annotated[list[BaseMessage], add_messages]
    items: Annotated[list[str], operator.add]


def _agent(state: Chat) -> dict:
    n = len(state["messages"])
    return {"messages": [AIMessage(f"answer {n}", id=f"ai-{n}")]}


def _review(state: Chat) -> dict:
    answer = interrupt({"question": "approve?", "seen": len(state["messages"])})
    return {"items": [f"review:{answer}"]}


def _fan_out(state: Chat) -> list[Send]:
    return [Send("worker", {"items": [f"job{i}"]}) for i in range(2)]


def _worker(state: Chat) -> dict:
    return {"items": ["worked"]}


def chat_graph(saver: Any):
    """agent -> review (interrupt) -> two Sends to worker -> END."""
    builder = StateGraph(Chat).add_node("agent", _agent).add_node("review", _review).add_node("worker", _worker)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "review")
    builder.add_conditional_edges("review", _fan_out)
    builder.add_edge("worker", END)
    return builder.compile(checkpointer=saver)


def config(thread_id: str, **metadata: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if metadata:
        out["metadata"] = metadata
    return out


def populate(saver: Any, users: tuple[str, ...] = ("ann", "bob"), finished: tuple[str, ...] = ("ann",)) -> Any:
    """One thread per user (``chat-<user>``, run ``<user>-1``); those in ``finished`` are
    resumed past the interrupt (run ``<user>-2``), the others wait at it."""
    graph = chat_graph(saver)
    for user in users:
        first = {"messages": [HumanMessage(f"hello from {user}", id=f"h-{user}")]}
        graph.invoke(first, config(f"chat-{user}", user=user, run_id=f"{user}-1"))
        if user in finished:
            graph.invoke(Command(resume="yes"), config(f"chat-{user}", user=user, run_id=f"{user}-2"))
    return graph


def cli_env(endpoint: str, mode: str = "dynamodb", **extra: str | None) -> dict[str, str]:
    """The environment a Lambda function has: credentials, endpoint, bucket, table (dynamodb mode)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CHECKPOINT_")) and k != "COLUMNS"}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        CHECKPOINT_BUCKET=BUCKET,
    )
    if mode == "dynamodb":
        env["CHECKPOINT_TABLE"] = TABLE
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(
    endpoint: str,
    *args: str,
    mode: str = "dynamodb",
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    script: bool = False,
    cwd: str | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """The command line with ARGS, pipes on every stream: in this process through the console
    script's entry point (``s3_saver.cli:main``), or with ``process``/``script`` as a process
    of its own (``python -m s3_saver``, or the console script), as in a shell.

    A process costs a second or more of imports, so most tests run it here; the few that keep
    a process check what only a process has (the console script, ``python -m``, a real pipe).
    Both give the same ``CompletedProcess``: exit code, stdout and stderr bytes.
    """
    env = env if env is not None else cli_env(endpoint, mode)
    stdin = stdin if stdin is not None else b""
    if not (process or script):
        return _in_process(list(args), env, stdin, cwd)
    command = [str(CONSOLE_SCRIPT)] if script else [sys.executable, "-m", "s3_saver"]
    return subprocess.run([*command, *args], env=env, input=stdin, capture_output=True, timeout=120, cwd=cwd)


# What a process of its own would not share with the test that runs it: its environment (all
# of it: a variable of the test process that `env` lacks is removed), its streams (pipes:
# not terminals, so no progress bar and tables as wide as a pipe gets), its working directory,
# and where the library's log records go (stderr, by logging's last resort, as a process
# with no logging configured). The moto server runs in this process: its loggers stay out.
_SERVER_LOGGERS = ("werkzeug", "moto")


class _NotTheServer(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(_SERVER_LOGGERS)


@contextlib.contextmanager
def _attribute(owner: Any, name: str, value: Any):
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@contextlib.contextmanager
def _working_directory(path: str):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _in_process(args: list[str], env: dict[str, str], stdin: bytes, cwd: str | None) -> subprocess.CompletedProcess[bytes]:
    from click import formatting as click_formatting
    from click.testing import CliRunner

    from s3_saver.cli import main

    overrides: dict[str, str | None] = {key: None for key in os.environ if key not in env}
    overrides.update(env)
    root = logging.getLogger()
    with contextlib.ExitStack() as stack:
        out, err, _ = stack.enter_context(CliRunner().isolation(input=stdin, env=overrides))
        # click wraps help at the terminal's width (shutil.get_terminal_size: COLUMNS, else
        # the size of sys.__stdout__, else 80 columns): CliRunner forces 80; a process whose
        # stdout is a pipe gets the fallback, as here with sys.__stdout__ the captured pipe.
        stack.enter_context(_attribute(click_formatting, "FORCED_WIDTH", None))
        stack.enter_context(_attribute(sys, "__stdout__", sys.stdout))
        if cwd is not None:
            stack.enter_context(_working_directory(cwd))
        last_resort = logging.StreamHandler(sys.stderr)  # the captured stderr, as logging.lastResort
        last_resort.setLevel(logging.WARNING)
        last_resort.addFilter(_NotTheServer())
        root.addHandler(last_resort)
        stack.callback(root.removeHandler, last_resort)
        try:
            main(args, PROG_NAME)
            code = 0  # main() always exits; reaching here would be exit 0 too
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.CompletedProcess(["langgraph-s3-saver", *args], code, out.getvalue(), err.getvalue())


def ok(result: subprocess.CompletedProcess[bytes], code: int = 0) -> str:
    """stdout of a run that exited with ``code``; nothing of a progress bar in the pipe."""
    stderr = result.stderr.decode()
    assert result.returncode == code, f"exit {result.returncode}, stderr:\n{stderr}\nstdout:\n{result.stdout.decode()}"
    assert BAR not in stderr and "\x1b[" not in stderr, stderr
    return result.stdout.decode()


def error_line(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    """The one ``error: ...`` line of a run that failed with ``code`` (no traceback)."""
    stderr = result.stderr.decode()
    assert result.returncode == code, f"exit {result.returncode}, stderr:\n{stderr}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- Ctrl-C at a chosen request ------------------------------------------------------------
HELD, UNHEARD, HEARD = "held", "unheard", "heard"


class Gate:
    """A TCP proxy in front of the moto server that stops a command at its ``at``-th request
    (counted from 1 over every connection, in the order the requests arrive whole).

    What happens to that request: ``held``, the store never gets it (the command waits for
    an answer); ``unheard``, the store does it and its answer is kept from the command;
    ``heard``, it goes both ways (the command goes on to read the answer). Every later
    request is held, so the store stays as the command left it. ``reached`` is set then:
    the moment to press Ctrl-C, known from what the command did, not from a sleep.
    ``at=None`` lets everything through and counts (``requests``).
    """

    def __init__(self, endpoint: str, at: int | None = None, kind: str = HELD) -> None:
        from regions import _hostport

        self.upstream = _hostport(endpoint)
        self.at, self.kind = at, kind
        self.requests = 0
        self.reached = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            store = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, store]
            unheard = threading.Event()
            threading.Thread(target=self._requests, args=(client, store, unheard), daemon=True).start()
            threading.Thread(target=self._answers, args=(store, client, unheard), daemon=True).start()

    def _requests(self, client: socket.socket, store: socket.socket, unheard: threading.Event) -> None:
        from regions import _parse_request

        buffer = bytearray()
        while data := _recv(client):
            buffer += data
            while (request := _parse_request(buffer)) is not None and request.end is not None:
                whole = bytes(buffer[: request.end])
                del buffer[: request.end]
                with self._lock:
                    self.requests += 1
                    number = self.requests
                if self.at is not None and number > self.at or number == self.at and self.kind == HELD:
                    self.reached.set()
                    continue  # never sent: the command waits for its answer
                if number == self.at and self.kind == UNHEARD:
                    unheard.set()
                store.sendall(whole)
                if number == self.at:
                    self.reached.set()

    def _answers(self, store: socket.socket, client: socket.socket, unheard: threading.Event) -> None:
        while data := _recv(store):
            if not unheard.is_set():
                client.sendall(data)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""
