"""The operator's command line: ``langgraph-s3-saver`` (or ``python -m s3_saver``).

A thin layer over [S3Saver][s3_saver.S3Saver]'s public methods: click parses the
command line (global options also read from the environment a Lambda function
already has), rich draws tables, values and progress bars. Both come with the
``cli`` extra; `main()` says so when they are missing.

Exit codes: 0 success, 1 the store or the saver failed, 2 usage error, 3 not
found, 130 interrupted; ``verify`` (and ``gc`` in a dry run) exit with a bitmask
of what they found (see ``_app.EXIT_*``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

MISSING_EXTRA = (
    "the command line needs the cli extra (click and rich), which is not installed: "
    "pip install '.[cli]' in a checkout of s3_saver (or its path instead of '.')"
)


def main(args: Sequence[str] | None = None, prog_name: str | None = None) -> None:
    """Run the command line and exit with its exit code (the console script's entry point).

    Ctrl-C ends it with exit 130 wherever it is (see ``_interrupt``): SIGINT's handler is
    set first thing, and the command runs in a thread of its own."""
    from s3_saver.cli import _interrupt

    with _interrupt.ending_the_process() as threaded:
        try:
            import click  # noqa: F401
            import rich  # noqa: F401
        except ImportError:
            print(MISSING_EXTRA, file=sys.stderr)
            sys.exit(1)
        from s3_saver.cli._group import interrupted, run

        _interrupt.on_interrupt[:] = [interrupted]
        code = _interrupt.run_in_thread(lambda: run(args, prog_name)) if threaded else run(args, prog_name)
    sys.exit(code)


__all__ = ["MISSING_EXTRA", "main"]
