"""The command line on a terminal: progress bars on stderr (and only there), the
confirmation prompt of a destructive command, and Ctrl-C (exit 130).

stderr (and for the prompt stdin) is a pseudo-terminal; stdout stays a pipe, so the
results are read as in a script. tests/test_cli.py checks (in every run through
``ok()``) that with pipes stderr holds nothing of a progress bar.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable

from cli_support import BAR, HEARD, HELD, UNHEARD, Gate, cli_env, config, ok, populate, run_cli
from conftest import make_saver
from helpers import cut_points, long_form
from s3_saver._transport.sync import SyncDriver


def frames(terminal: str) -> list[str]:
    """The progress lines drawn on the terminal, colours taken out, oldest first."""
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", terminal)
    return [line.strip() for line in re.split(r"[\r\n]+", plain) if BAR in line]


def start_on_terminal(
    env: dict[str, str], *args: str, answer: bytes | None = None
) -> tuple[subprocess.Popen, Callable[[], tuple[int, str, str]]]:
    """Start ``python -m s3_saver ARGS`` with stderr on a pseudo-terminal 120 columns wide
    (stdin too when ``answer`` is given: it is typed there). Returns the process and what
    waits for its end: (exit code, stdout, terminal)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "s3_saver", *args],
        stdin=slave if answer is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    seen: list[bytes] = []

    def pump() -> None:  # the pty's buffer is small: read it while the command runs
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed it
                return
            if not data:
                return
            seen.append(data)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    if answer is not None:
        os.write(master, answer)

    def finish() -> tuple[int, str, str]:
        stdout = process.stdout.read()
        process.wait(timeout=120)
        reader.join(timeout=10)
        os.close(master)
        return process.returncode, stdout.decode(), b"".join(seen).decode(errors="replace")

    return process, finish


def run_on_terminal(env: dict[str, str], *args: str, answer: bytes | None = None) -> tuple[int, str, str]:
    """`start_on_terminal`, run to its end."""
    return start_on_terminal(env, *args, answer=answer)[1]()


def test_progress_on_a_terminal_only(endpoint: str, tmp_path) -> None:
    saver = make_saver(endpoint)
    saver.setup()
    populate(saver, users=("ann", "bob", "cid", "dan"), finished=("ann", "cid"))
    env = cli_env(endpoint)

    # verify over several threads: a bar with items done/total, bytes, rates and the ETA.
    code, out, terminal = run_on_terminal(env, "verify")
    assert code == 0 and "4 threads" in out and "consistent" in out and BAR not in out and "\x1b[" not in out
    final = frames(terminal)[-1]
    assert BAR in final and "verify" in final and "4/4 threads" in final and "ETA" in final and "0:00:00" in final
    assert "kB" in final and "/s" in final

    # export: one thread, the bytes written.
    code, out, terminal = run_on_terminal(env, "export", "chat-ann", str(tmp_path / "ann.export"))
    size = (tmp_path / "ann.export").stat().st_size
    assert code == 0 and f"{size:,} bytes" in out
    final = frames(terminal)[-1]
    assert "export" in final and "1/1 threads" in final and "kB" in final and "ETA" in final

    # Asked not to: no bar, on a terminal too; --json output never has one.
    code, out, terminal = run_on_terminal(env, "--no-progress", "delete", "--yes", "chat-dan")
    assert code == 0 and "deleted 1 thread: chat-dan" in out and BAR not in terminal and terminal.strip() == ""
    code, out, terminal = run_on_terminal(env, "--json", "verify")
    assert code == 0 and json.loads(out)["threads"] == 3 and BAR not in terminal
    saver.close()


def test_confirmation_prompt(endpoint: str) -> None:
    """On a terminal, delete asks: "n" changes nothing (exit 2), "y" deletes."""
    saver = make_saver(endpoint)
    saver.setup()
    populate(saver, users=("ann",))
    env = cli_env(endpoint)
    code, out, terminal = run_on_terminal(env, "--no-progress", "delete", "chat-ann", answer=b"n\n")
    assert code == 2 and "Delete 1 thread (chat-ann)? [y/N]" in terminal and "not confirmed" in terminal
    assert saver.get_tuple(config("chat-ann")) is not None
    code, out, terminal = run_on_terminal(env, "--no-progress", "delete", "chat-ann", answer=b"y\n")
    assert code == 0 and "deleted 1 thread: chat-ann" in out
    assert saver.get_tuple(config("chat-ann")) is None
    saver.close()


# Ctrl-C ends a command at once: it waits neither for the request in flight (up to
# the read timeout) nor for the pool's requests; a Ctrl-C lost in a finalizer would let
# the command run on to its timeouts (exit 1). Well under the read timeout (5 s).
PROMPT_EXIT = 2.5


def _first_request(server: socket.socket, bucket: str) -> socket.socket:
    """The connection on which the command sent its first request (HeadBucket of its
    ``bucket``), read whole. Another process's connection to this port is not it."""
    while True:
        connection, _ = server.accept()
        head = b""
        while b"\r\n\r\n" not in head and (data := connection.recv(65536)):
            head += data
        if head.startswith(f"HEAD /{bucket} ".encode()):
            return connection
        connection.close()


def test_ctrl_c_is_exit_130(endpoint: str) -> None:
    """SIGINT while a request waits on a store that never answers: exit 130 at once, one line.

    Pressed once the command has sent its first request (the store saw it whole), not at a
    connection: an early SIGINT meets the interpreter starting, not the command line."""
    bucket = f"ctrl-c-{uuid.uuid4().hex[:12]}"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(60)
        port = server.getsockname()[1]
        env = cli_env(endpoint, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", CHECKPOINT_BUCKET=bucket)
        process = subprocess.Popen(
            [sys.executable, "-m", "s3_saver", "threads"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        with _first_request(server, bucket):  # never answered
            pressed = time.monotonic()
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
            took = time.monotonic() - pressed
    assert process.returncode == 130, stderr.decode()
    assert [line for line in stderr.decode().splitlines() if line.strip()] == ["error: interrupted"]
    assert took < PROMPT_EXIT, took


DELETED = ("a", "b", "c")


def test_ctrl_c_at_any_request_exits_130_and_a_run_again_finishes(endpoint: str, index_mode: str, monkeypatch) -> None:
    """`delete` of three threads, a progress bar on the terminal, Ctrl-C at its k-th request:
    held from the store, done by the store but its answer not heard, or answered (Ctrl-C
    then meets the command reading it). Every time: exit 130 at once, "error: interrupted"
    and nothing else on the terminal; then `delete` run again deletes what is left, and the
    store holds nothing of the three threads.

    ``make test`` presses at a few requests (the first two, the last two, the first the
    thread pool sends with others), one way each; ``make test-all`` at every request,
    every way."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()

    def threads(tag: str) -> list[str]:
        users = tuple(f"{tag}-{user}" for user in DELETED)
        populate(saver, users=users, finished=users[:1])
        return [f"chat-{user}" for user in users]

    # A run to count: its requests, and the waves the sync driver's thread pool sends.
    counted = threads("count")
    waves: list[int] = []
    send_wave = SyncDriver._wave
    monkeypatch.setattr(SyncDriver, "_wave", lambda driver, calls: waves.append(len(calls)) or send_wave(driver, calls))
    counting = Gate(endpoint)
    ok(run_cli(endpoint, "delete", "--yes", *counted, env=cli_env(endpoint, index_mode, AWS_ENDPOINT_URL=counting.url)))
    counting.close()
    monkeypatch.undo()
    assert sum(waves) == counting.requests
    kinds = (HELD, UNHEARD, HEARD)
    points = [
        (at, kind)
        for index, at in enumerate(cut_points(counting.requests, most=4), start=1)
        for kind in (kinds if long_form() else (kinds[index % len(kinds)],))
    ]
    # And while the thread pool waits on its first wave: the wave's first request held, the
    # others with it.
    pooled = next(sum(waves[:index]) + 1 for index, size in enumerate(waves) if size > 1)
    points.append((pooled, HELD))
    jitter = random.Random(index_mode)
    for at, kind in points:
        where = f"request {at} of {counting.requests}, {kind}"
        ids = threads(f"{at}{kind}")
        gate = Gate(endpoint, at, kind)
        try:
            process, finish = start_on_terminal(cli_env(endpoint, index_mode, AWS_ENDPOINT_URL=gate.url), "delete", "--yes", *ids)
            assert gate.reached.wait(60), where
            if kind == HEARD:
                time.sleep(jitter.uniform(0, 0.02))  # while the command reads the answer, or after
            pressed = time.monotonic()
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
            took = time.monotonic() - pressed
            code, _, terminal = finish()
        finally:
            gate.close()
        said = [line for line in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", terminal).splitlines() if line.strip() and BAR not in line]
        assert code == 130 and said == ["error: interrupted"], f"{where}: exit {code}, {terminal!r}"
        assert took < PROMPT_EXIT, f"{where}: {took:.1f} s"
        again = run_cli(endpoint, "delete", "--yes", *ids, mode=index_mode)
        assert again.returncode in (0, 3), f"{where}: {again.stderr.decode()}"  # 3: deleted before Ctrl-C
        assert [t for t in ids if saver.get_tuple(config(t)) is not None] == [], where
        ok(run_cli(endpoint, "verify", "--older-than", "0s", *ids, mode=index_mode))  # nothing left behind
    saver.close()
