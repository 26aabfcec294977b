"""``rewrap``: the encryption's key rotation (``S3Saver.rewrap``).

The key the records are wrapped by now is the global options' (``--kms-key``, or
``--local-key`` from ``S3_SAVER_LOCAL_KEY``); the new one is ``--to-kms-key KEY``, or
``--to-local-key``, read from ``S3_SAVER_NEW_LOCAL_KEY`` (never key material on the
command line, where other users' ``ps`` shows it). It asks on a terminal and refuses in
a pipe without ``--yes``, as ``erase`` does.
"""

from __future__ import annotations

import click

from s3_saver.cli._app import App, pass_app
from s3_saver.cli._output import plural

NEW_LOCAL_KEY_ENV = "S3_SAVER_NEW_LOCAL_KEY"


@click.command("rewrap", short_help="Wrap every thread's data key under a new key (rotation).")
@click.option("--to-kms-key", metavar="KEY", help="The new KMS key (id, ARN or alias).")
@click.option("--to-local-key", is_flag=True, help=f"The new local master key, read from {NEW_LOCAL_KEY_ENV}.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_app
def rewrap_command(app: App, to_kms_key: str | None, to_local_key: bool, yes: bool) -> None:
    """Wrap every thread's data key under a new key: --to-kms-key KEY, or --to-local-key
    (the master key in S3_SAVER_NEW_LOCAL_KEY). The key they are wrapped by now is
    --kms-key or --local-key's. No checkpoint is rewritten.

    Records under the new key already are skipped and erased threads' are left alone:
    run it again to finish a run cut short, and once every process is configured with
    the new key (it then wraps nothing)."""
    if bool(to_kms_key) == to_local_key:
        raise click.UsageError("give the new key: --to-kms-key KEY or --to-local-key (one of them)")
    if not (app.kms_key or app.local_key):
        raise click.UsageError(
            "rewrap needs the key the records are wrapped by now: --kms-key KEY or --local-key (S3_SAVER_LOCAL_KEY)"
        )
    from s3_saver import KmsKey, LocalKey

    if to_kms_key:
        target: KmsKey | LocalKey = KmsKey(to_kms_key)
        named = f"KMS key {to_kms_key}"
    else:
        import os

        text = os.environ.get(NEW_LOCAL_KEY_ENV)
        if not text:
            raise click.UsageError(f"--to-local-key reads the new master key from {NEW_LOCAL_KEY_ENV}, which is not set")
        from s3_saver import ConfigurationError

        try:
            target = LocalKey(text)
        except ConfigurationError:
            raise click.UsageError(f"{NEW_LOCAL_KEY_ENV} must hold 32 random bytes as base64 text") from None
        named = f"the local master key {target.fingerprint}"
    app.confirm(f"wrap every thread's data key in the key store of {app.store_name()} under {named}", yes)
    saver = app.saver()
    report = saver.rewrap(target)
    if app.out.json:
        app.out.emit_json(
            {
                "kek": report.kek,
                "rewrapped": report.rewrapped,
                "already": report.already,
                "erased": report.erased,
                "key_stores": report.key_stores,
            }
        )
        return
    app.out.message(
        f"wrapped {plural(report.rewrapped, 'key')} anew under {report.kek} "
        f"({report.already} under it already, {plural(report.erased, 'erased thread')} left alone) "
        f"in {', '.join(report.key_stores)}"
    )


COMMANDS = [rewrap_command]
