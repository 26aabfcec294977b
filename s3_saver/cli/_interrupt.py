"""Ctrl-C: exit 130 at once, with one line, whatever the command was doing.

Python's own SIGINT handling raises KeyboardInterrupt in the main thread at whatever
bytecode it runs, and there it can be lost or stall the exit:

- in a finalizer (a weakref callback, a ``__del__`` that the garbage collector or a
  reference count drop runs), the interrupt is printed as "Exception ignored" and
  dropped: the command goes on (against a store that does not answer, it ends with
  exit 1 after its timeouts);
- in a lock's ``__exit__`` written in Python (``threading.Condition``, which the sync
  driver's pool and its futures use), the lock stays held: closing the pool, or the
  interpreter's exit, waits on it for ever;
- while the pool sends a wave, closing the saver waits for the requests in flight:
  seconds (a read timeout) before the exit.

So the command runs in a thread of its own, the main thread only waits for it, and
SIGINT's handler, run in the main thread, ends the process: "error: interrupted" on
stderr (and the JSON error document with ``--json``), exit 130. Nothing is raised, so
nothing can be lost or leave a lock held.

Ending there is what a crash does, and what the saver is built to survive: an
operation cut short at any request leaves every thread readable or gone, and running
the command again finishes the work. The files the command line writes (``export``)
appear under their name only once complete.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

EXIT_INTERRUPTED = 130

# Set once the command line is loaded: writes what an interrupted run says (the error
# line, the JSON document, the terminal's cursor back). Until then, the line alone.
on_interrupt: list[Callable[[Any], None]] = []


def _interrupted(signum: int, frame: Any) -> None:
    try:
        if on_interrupt:
            on_interrupt[0](_command_frame())
        else:
            os.write(2, b"error: interrupted\n")
    finally:
        os._exit(EXIT_INTERRUPTED)


_command: list[threading.Thread] = []


def _command_frame() -> Any:
    """The frame the command's thread is in (for ``--debug``), or None."""
    return sys._current_frames().get(_command[0].ident) if _command and _command[0].ident else None


@contextmanager
def ending_the_process() -> Iterator[bool]:
    """While in the block, SIGINT ends the process with exit 130 (see the module's
    docstring); after it, SIGINT does what it did before. Yields whether it does.

    Only the main thread can set a signal handler, and only it runs Python's signal
    handlers: entered in another thread, nothing changes and the caller handles Ctrl-C.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        yield True
    finally:
        signal.signal(signal.SIGINT, previous)


def run_in_thread(work: Callable[[], int]) -> int:
    """``work()`` in a thread of its own, the main thread waiting for it (where the
    SIGINT handler runs: a blocking wait is interrupted by the signal)."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # noqa: BLE001 (raised again by the main thread below)
            outcome.append(exc)

    thread = threading.Thread(target=target, name="langgraph-s3-saver", daemon=True)
    _command[:] = [thread]
    thread.start()
    # Timed joins: should the kernel hand SIGINT to another thread, the main thread
    # still runs the handler within this interval.
    while thread.is_alive():
        thread.join(0.2)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result
