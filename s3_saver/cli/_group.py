"""The command group: global options, the commands registered, an exit code for each run.

Every global option also comes from the environment a Lambda function already
has (``CHECKPOINT_BUCKET``, ``CHECKPOINT_TABLE``, ``AWS_REGION``...), so an
operator's shell configured like the function reaches the same store.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click
from click.core import ParameterSource

from s3_saver.cli._app import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, App
from s3_saver.cli._messages import cli_words
from s3_saver.cli._output import live_progress

EPILOG = (
    "Exit codes: 0 ok, 1 the store or the saver failed, 2 usage error, 3 not found, 130 interrupted; "
    "verify (and gc without --yes) add 4 orphans, 8 unindexed threads, 16 missing objects, 32 broken index."
)

# Set by the group's callback: run() needs --debug after the parse.
_current: list[App] = []


# The global options: every command takes them before its name and after it
# (`--json threads` and `threads --json`), as users type them. Read from the environment
# (envvar) by the group only: a command's copy takes what its own words say.
GLOBAL_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--bucket",), dict(envvar="CHECKPOINT_BUCKET", metavar="NAME", help="S3 bucket (required).")),
    (
        ("--table",),
        dict(
            envvar="CHECKPOINT_TABLE",
            metavar="NAME",
            help="DynamoDB table of the index; without it the index is the manifest in the bucket.",
        ),
    ),
    (("--prefix",), dict(envvar="CHECKPOINT_PREFIX", metavar="PREFIX", help="Key prefix in the bucket.")),
    (
        ("--region",),
        dict(envvar=["AWS_REGION", "AWS_DEFAULT_REGION"], metavar="REGION", help="AWS region of the bucket and table."),
    ),
    (("--endpoint-url",), dict(envvar="AWS_ENDPOINT_URL", metavar="URL", help="One endpoint for S3 and DynamoDB.")),
    (("--s3-endpoint-url",), dict(envvar="AWS_ENDPOINT_URL_S3", metavar="URL", help="S3 endpoint (MinIO, R2...).")),
    (("--dynamodb-endpoint-url",), dict(envvar="AWS_ENDPOINT_URL_DYNAMODB", metavar="URL", help="DynamoDB endpoint.")),
    (
        ("--serde",),
        dict(
            envvar="CHECKPOINT_SERDE",
            metavar="MODULE:ATTR",
            help="Serializer the threads were written with: an object, or a class or zero-argument factory of one.",
        ),
    ),
    (
        ("--kms-key",),
        dict(
            envvar="CHECKPOINT_KMS_KEY",
            metavar="KEY",
            help="Threads encrypted with a data key per thread wrapped by this KMS key (id, ARN or alias).",
        ),
    ),
    (
        ("--local-key",),
        dict(
            is_flag=True,
            envvar="CHECKPOINT_LOCAL_KEY",
            help="Threads encrypted with a data key per thread wrapped by the master key in S3_SAVER_LOCAL_KEY.",
        ),
    ),
    (
        ("--key-bucket",),
        dict(envvar="CHECKPOINT_KEY_BUCKET", metavar="NAME", help="The encryption key store's bucket (default: BUCKET-keys)."),
    ),
    (("--json", "json"), dict(is_flag=True, help="Machine-readable output: one JSON document on stdout.")),
    (("--no-progress",), dict(is_flag=True, help="No progress bars (they are shown only on a terminal anyway).")),
    (("--debug",), dict(is_flag=True, help="Print the traceback of an error.")),
]


def _global_options(command: Any) -> Any:
    for decls, settings in reversed(GLOBAL_OPTIONS):
        extra = {"show_envvar": True} if "envvar" in settings else {}
        command = click.option(*decls, **settings, **extra)(command)
    return command


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@_global_options
@click.version_option(package_name="langgraph-s3-saver", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, **options: Any) -> None:
    """Inspect and maintain LangGraph checkpoints (S3Saver) and long-term memory (S3Store) stored by s3_saver.

    The options below may also follow the command: `threads --json`."""
    app = App(**options)
    app.before = {name for name in options if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE}
    _current[:] = [app]
    ctx.obj = app
    ctx.call_on_close(app.close)


def _after_the_command(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """A global option given after the command's name: it wins over the environment. Given
    on both sides, it must say the same: which one was meant is not for the tool to guess."""
    if value is None or value is False or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
        return
    app = ctx.find_object(App)
    current = getattr(app, param.name)
    if param.name in app.before and current != value:
        flag = param.opts[0]
        raise click.UsageError(
            f"{flag} is given before the command ({current!r}) and after it ({value!r}): give it once", ctx
        )
    app.set(param.name, value)


def _late_copies(command: click.Command) -> None:
    """Give ``command`` a hidden copy of each global option (no envvar: the group reads it)."""
    if command.epilog is None:
        command.epilog = "The global options (--bucket, --json...: see the program's --help) may follow the command too."
    taken = {opt for param in command.params for opt in param.opts}
    for decls, settings in GLOBAL_OPTIONS:
        flags = [d for d in decls if d.startswith("-")]
        assert not taken & set(flags), f"{command.name} has an option of its own named {flags}"
        copy = {k: v for k, v in settings.items() if k not in ("envvar",)}
        default = False if copy.get("is_flag") else None
        command.params.append(
            click.Option(decls, default=default, expose_value=False, hidden=True, callback=_after_the_command, **copy)
        )


def _register() -> None:
    from s3_saver.cli import _inspect, _keys, _lifecycle, _maintain, _memory, _migrate

    for module in (_maintain, _inspect, _lifecycle, _keys, _migrate, _memory):
        for command in module.COMMANDS:
            # A group's commands take the global options after their names too (`memory show --json`).
            for each in [command, *getattr(command, "commands", {}).values()]:
                _late_copies(each)
            cli.add_command(command)


_register()


_json_asked: list[bool] = []


def run(args: Sequence[str] | None = None, prog_name: str | None = None) -> int:
    """Run the group; map what it raised to one ``error: ...`` line on stderr and an exit code."""
    from botocore.exceptions import BotoCoreError, ClientError

    from s3_saver.errors import S3SaverError

    _current.clear()
    argv = list(args) if args is not None else sys.argv[1:]
    # --json asked for, even where the group's options were not parsed yet (a usage error).
    _json_asked[:] = ["--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv]
    try:
        result = cli.main(args=list(args) if args is not None else None, prog_name=prog_name, standalone_mode=False)
        return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
    except click.exceptions.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt):
            return _fail("interrupted", EXIT_INTERRUPTED, exc)
        return _fail("aborted: nothing was changed", EXIT_USAGE, exc)
    except KeyboardInterrupt as exc:
        return _fail("interrupted", EXIT_INTERRUPTED, exc)
    except click.UsageError as exc:
        exc.show()
        _emit_json_error("UsageError", exc.format_message(), exc.exit_code)
        return exc.exit_code
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code, exc)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, without a second error at exit.
        _silence_stdout()
        return EXIT_FAILED
    except (S3SaverError, BotoCoreError, ClientError) as exc:
        return _fail(str(exc), EXIT_FAILED, exc)
    except Exception as exc:  # an unexpected failure: still one line (the traceback with --debug)
        return _fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED, exc)


def _fail(message: str, code: int, exc: BaseException) -> int:
    if _current and _current[0].debug:
        traceback.print_exception(exc)
    first, *rest = (cli_words(message) or type(exc).__name__).splitlines() or [""]
    line = " ".join([first, *(part.strip() for part in rest)]).strip()
    click.echo(f"error: {line}", err=True)
    _emit_json_error(type(exc).__name__, line, code)
    return code


def _json_wanted() -> bool:
    return bool(_current and _current[0].json or _json_asked and _json_asked[0])


def _json_error(kind: str, message: str, code: int) -> str:
    return json.dumps({"error": {"kind": kind, "message": message, "exit_code": code}}, ensure_ascii=False) + "\n"


def _emit_json_error(kind: str, message: str, code: int) -> None:
    """With --json, an error is a JSON document on stdout too: a script reads one place."""
    if _json_wanted():
        sys.stdout.write(_json_error(kind, message, code))
        sys.stdout.flush()


def interrupted(frame: Any) -> None:
    """What a run ended by Ctrl-C says (SIGINT's handler, in the main thread; the process
    ends right after). Straight to the file descriptors: the command's thread may hold
    the locks of sys.stdout and sys.stderr, and what it buffered but did not write is
    not written."""
    if live_progress():
        os.write(2, b"\n\x1b[?25h")  # below the bar, the cursor the bar hid shown again
    if frame is not None and _current and _current[0].debug:
        os.write(2, ("Traceback of the command when interrupted:\n" + "".join(traceback.format_stack(frame))).encode())
    os.write(2, b"error: interrupted\n")
    if _json_wanted():
        os.write(1, _json_error("KeyboardInterrupt", "interrupted", EXIT_INTERRUPTED).encode())


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
