"""A throwaway PostgreSQL server for the tests: the session fixture ``postgres_url``.

The machine's PostgreSQL binaries (``initdb`` and ``postgres`` on PATH, or in
``/usr/lib/postgresql/<version>/bin``) run a cluster in a temporary directory,
on 127.0.0.1 and a free port, with ``fsync=off`` (nothing here must survive a
crash). initdb refuses to run as root: under root both commands run as the
``postgres`` OS user (``runuser -u postgres --``). Without binaries (or without
that user under root) the tests that use the fixture are skipped, saying what
is missing. Registered from conftest.py.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

START_TIMEOUT = 60.0  # seconds until the server accepts connections
SERVER_USER = "postgres"


def _version(bin_dir: str) -> tuple[int, ...]:
    name = os.path.basename(os.path.dirname(bin_dir))
    return tuple(int(p) for p in name.split(".") if p.isdigit()) or (0,)


def find_binaries() -> tuple[str, str] | str:
    """``(initdb, postgres)``, or why they were not found."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(os.path.dirname(os.path.realpath(on_path)))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    for bin_dir in dict.fromkeys(candidates):
        initdb, postgres = os.path.join(bin_dir, "initdb"), os.path.join(bin_dir, "postgres")
        if os.access(initdb, os.X_OK) and os.access(postgres, os.X_OK):
            return initdb, postgres
    looked = ", ".join(dict.fromkeys(candidates)) or "nothing found"
    return (
        "PostgreSQL server binaries (initdb and postgres) not found on PATH or in "
        f"/usr/lib/postgresql/*/bin (looked in: {looked})"
    )


def _as_server_user() -> tuple[list[str], int | None, int | None] | str:
    """The command prefix that runs a program as the server's user, and that user's
    uid/gid (None when the tests do not run as root); or why it cannot be done."""
    if os.geteuid() != 0:
        return [], None, None
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        return f"running as root, and initdb refuses root, but there is no {SERVER_USER!r} OS user to run it as"
    runuser = shutil.which("runuser")
    if runuser is None:
        return "running as root, and initdb refuses root, but `runuser` is not installed"
    return [runuser, "-u", SERVER_USER, "--"], entry.pw_uid, entry.pw_gid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _stop(process: subprocess.Popen, data: str) -> None:
    """Fast shutdown (SIGINT to the postmaster), then SIGKILL to what is left."""
    pid = process.pid
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            pid = int(f.readline())  # the server itself, not runuser
    except (OSError, ValueError):
        pass
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            return
        try:
            os.kill(pid, sig)
            if sig == signal.SIGKILL:
                os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def create_database(url: str) -> str:
    """A new, empty database on the server of ``url``; returns its URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """``postgresql://postgres@127.0.0.1:<port>/postgres`` of a server up for the session."""
    found = find_binaries()
    if isinstance(found, str):
        pytest.skip(found)
    user = _as_server_user()
    if isinstance(user, str):
        pytest.skip(user)
    initdb, postgres = found
    prefix, uid, gid = user
    # Not under pytest's tmp dirs: those are private to root, and the server
    # (as another user) must reach its directory. Short too: the unix socket
    # path must fit in 107 bytes.
    root = tempfile.mkdtemp(prefix="s3saver-pg-")
    if uid is not None:
        os.chown(root, uid, gid)
    data = os.path.join(root, "data")
    log_path = os.path.join(root, "server.log")
    try:
        init = subprocess.run(
            [*prefix, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}):\n{init.stdout}\n{init.stderr}")
        port = _free_port()
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*prefix, postgres, "-D", data, "-p", str(port), "-k", root, "-h", "127.0.0.1",
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not _accepts(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, errors="replace") as f:
                        tail = f.read()[-4000:]
                    state = f"exited with {process.returncode}" if process.poll() is not None else "did not answer"
                    raise RuntimeError(f"postgres {state} (port {port}):\n{tail}")
                time.sleep(0.1)  # polling for readiness, not timing anything
            yield url
        finally:
            _stop(process, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)
