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
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading

from cli_support import BAR, cli_env, config, populate
from conftest import make_saver


def frames(terminal: str) -> list[str]:
    """The progress lines drawn on the terminal, colours taken out, oldest first."""
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", terminal)
    return [line.strip() for line in re.split(r"[\r\n]+", plain) if BAR in line]


def run_on_terminal(env: dict[str, str], *args: str, answer: bytes | None = None) -> tuple[int, str, str]:
    """Run ``python -m s3_saver ARGS`` with stderr on a pseudo-terminal 120 columns wide
    (stdin too when ``answer`` is given: it is typed there). Returns (exit code, stdout, terminal)."""
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
    stdout = process.stdout.read()
    process.wait(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    return process.returncode, stdout.decode(), b"".join(seen).decode(errors="replace")


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


def test_ctrl_c_is_exit_130(endpoint: str) -> None:
    """SIGINT while a request waits on a store that never answers: exit 130 at once, one line."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = cli_env(endpoint, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        process = subprocess.Popen(
            [sys.executable, "-m", "s3_saver", "threads"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        server.settimeout(60)
        connection, _ = server.accept()  # the command's first request, never answered
        with connection:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert [line for line in stderr.decode().splitlines() if line.strip()] == ["error: interrupted"]
