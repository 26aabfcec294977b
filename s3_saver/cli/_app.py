"""What a command is given: the global options and the S3Saver they build (``App``,
``pass_app``), the exit codes, and the errors a command raises to end with one.

The command modules import this module; the group that gathers them (``_group``) imports
them and this module, never the other way round.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from s3_saver.cli._output import Output
from s3_saver.cli._params import load_serde

if TYPE_CHECKING:
    from s3_saver import S3Saver

# Exit codes (README "Command line").
EXIT_OK = 0
EXIT_FAILED = 1  # the store or the saver failed: any S3SaverError, botocore errors
EXIT_USAGE = 2  # click's usage errors, a destructive command not confirmed
EXIT_NOT_FOUND = 3  # a thread or checkpoint that does not exist
EXIT_INTERRUPTED = 130  # Ctrl-C
# verify (and gc in a dry run): one bit per kind of problem found; 0 = consistent.
EXIT_ORPHANS = 4
EXIT_UNINDEXED = 8
EXIT_MISSING = 16
EXIT_BROKEN = 32

class NotFoundError(click.ClickException):
    """A thread or checkpoint that does not exist (exit 3)."""

    exit_code = EXIT_NOT_FOUND


class NotConfirmedError(click.ClickException):
    """A destructive command without ``--yes`` where nobody can confirm it, or declined (exit 2)."""

    exit_code = EXIT_USAGE


@dataclass
class App:
    """The global options, and the saver built from them on first use."""

    bucket: str | None = None
    table: str | None = None
    prefix: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    s3_endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    serde: str | None = None
    kms_key: str | None = None
    local_key: bool = False
    key_bucket: str | None = None
    json: bool = False
    no_progress: bool = False
    debug: bool = False
    out: Output = field(init=False)
    # The global options given on the command line before the command's name.
    before: set[str] = field(default_factory=set, repr=False)
    _saver: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.out = Output(json_mode=self.json, progress=not self.no_progress)

    def set(self, name: str, value: Any) -> None:
        """A global option given after the command's name (before the saver is made)."""
        assert self._saver is None, "the saver is made after the command's options are read"
        setattr(self, name, value)
        if name in ("json", "no_progress"):
            self.out = Output(json_mode=self.json, progress=not self.no_progress)

    @property
    def mode(self) -> str:
        """``"dynamodb"`` (a table) or ``"manifest"`` (the index in the bucket)."""
        return "dynamodb" if self.table else "manifest"

    def store_name(self) -> str:
        """The store of the global options, for messages."""
        prefix = f" prefix {self.prefix!r}" if self.prefix else ""
        index = f"table {self.table!r}" if self.table else "manifest index"
        return f"bucket {self.bucket!r}{prefix} ({index})"

    def saver(self, checked: bool = True) -> S3Saver:
        """The S3Saver of the global options (made once; closed when the command ends).

        ``checked``: its bucket exists and owns the table (``S3Saver.check``), so
        no command answers from an index alone for a bucket that is gone or
        another bucket's table; ``setup`` creates them instead.
        """
        if self._saver is None:
            if not self.bucket:
                raise click.UsageError("Missing option '--bucket' (or CHECKPOINT_BUCKET in the environment).")
            from s3_saver import S3Saver

            self._saver = S3Saver(
                self.bucket,
                table=self.table or None,
                prefix=self.prefix or "",
                region_name=self.region or None,
                endpoint_url=self.endpoint_url or None,
                s3_endpoint_url=self.s3_endpoint_url or None,
                dynamodb_endpoint_url=self.dynamodb_endpoint_url or None,
                serde=load_serde(self.serde) if self.serde else None,
                encryption=self.encryption(),
            )
            if checked:
                self._saver.check()
        return self._saver

    def encryption(self) -> Any:
        """``encryption=`` of the saver: ``--kms-key`` or ``--local-key`` (never key material
        on the command line, where other users' ``ps`` shows it), with ``--key-bucket``."""
        if self.kms_key and self.local_key:
            raise click.UsageError("--kms-key and --local-key are two ways to encrypt: give one")
        if self.key_bucket and not (self.kms_key or self.local_key):
            raise click.UsageError("--key-bucket is the encryption key store: give it with --kms-key or --local-key")
        if self.kms_key:
            from s3_saver import KmsKey

            return KmsKey(self.kms_key, key_bucket=self.key_bucket or None)
        if self.local_key:
            from s3_saver import LocalKey

            return LocalKey(key_bucket=self.key_bucket or None)
        return None

    def close(self) -> None:
        if self._saver is not None:
            self._saver.close()
            self._saver = None

    def confirm(self, action: str, yes: bool) -> None:
        """Go on with a destructive ``action`` ("delete 2 threads: a, b"): ``--yes``, or a
        "y" typed on a terminal.

        Raises:
            NotConfirmedError: No ``--yes`` and stdin is not a terminal (nobody to ask), or declined.
        """
        if yes:
            return
        if not sys.stdin.isatty():
            raise NotConfirmedError(f"stdin is not a terminal and --yes was not given: refusing to {action}; nothing was changed")
        if not click.confirm(f"{action[0].upper()}{action[1:]}?", default=False, err=True):
            raise NotConfirmedError(f"not confirmed: did not {action}")


pass_app = click.make_pass_decorator(App)
