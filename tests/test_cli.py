"""The command line against the moto server, on threads a real LangGraph graph wrote in
this process: run in this process through its entry point (``run_cli``: pipes on every
stream, the environment it is given and nothing else), and as a process of its own where
that is what is tested (the console script and ``python -m`` in test_setup, a real pipe
into ``import -`` and out of ``export -``).

Each run checks several things: the table or JSON it prints, its exit code, and the store
afterwards. Progress bars, the prompt on a terminal and Ctrl-C are in
tests/test_cli_progress.py (processes on a pseudo-terminal).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.types import Command

from cli_support import chat_graph, cli_env, config, error_line, ok, populate, run_cli
from conftest import BUCKET, TABLE, make_saver
import s3_saver
from s3_saver import S3Saver
from s3_saver.cli import MISSING_EXTRA, main
from s3_saver.cli._checkpoint import next_nodes, values_size
from s3_saver.cli._messages import cli_words
from s3_saver.cli._params import KeyValue, format_duration, parse_duration
from s3_saver.cli._output import to_jsonable


@pytest.fixture
def chats(endpoint: str):
    """chat-ann (answered, fanned out to two workers) and chat-bob (waiting at the interrupt)."""
    saver = make_saver(endpoint)
    saver.setup()
    graph = populate(saver)
    yield saver, graph
    saver.close()


def _s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _exists(endpoint: str, key: str) -> bool:
    return "Contents" in _s3(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=key)


# -- in-process pieces -------------------------------------------------------------------
def test_durations_filters_and_missing_extra(monkeypatch, capsys) -> None:
    assert [parse_duration(t).total_seconds() for t in ("1h", "30m", "7d", "90s", "0s", "3600", "1h30m", "2w")] == [
        3600, 1800, 604800, 90, 0, 3600, 5400, 1209600
    ]
    for bad in ("1x", "-5m", "h", "", "1 h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert [format_duration(parse_duration(t)) for t in ("3600", "90s", "7d", "0")] == ["1h", "90s", "1w", "0s"]
    kv = KeyValue()
    assert [kv.convert(v, None, None) for v in ("step=3", "user=ann", 'user="3"', "done=true", "x=a=b")] == [
        ("step", 3), ("user", "ann"), ("user", "3"), ("done", True), ("x", "a=b")
    ]
    # JSON has no NaN or infinity: strict parsers refuse them, so they go out as strings.
    assert json.loads(json.dumps(to_jsonable({"x": float("nan"), "y": [float("-inf"), 1.5]}), allow_nan=False)) == {
        "x": "nan", "y": ["-inf", 1.5]
    }
    # Without the cli extra: one line naming it, exit 1.
    monkeypatch.setitem(sys.modules, "rich", None)
    with pytest.raises(SystemExit) as exited:
        main(["threads"])
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == MISSING_EXTRA
    # The package is not on PyPI: the command that works is the one from a checkout.
    assert "pip install '.[cli]'" in MISSING_EXTRA and "langgraph-s3-saver[" not in MISSING_EXTRA


def test_next_nodes_match_langgraph(chats) -> None:
    """history's `next` without the graph equals LangGraph's get_state_history (Sends included)."""
    saver, graph = chats
    history = list(graph.get_state_history(config("chat-ann")))
    assert any(s.next == ("worker", "worker") for s in history)  # the fan-out's PUSH tasks
    for snapshot in history:
        tup = saver.get_tuple(snapshot.config)
        assert next_nodes(tup.checkpoint) == sorted(snapshot.next)
        assert values_size(saver.serde, tup.checkpoint) == sum(
            len(saver.serde.dumps_typed(v)[1]) for v in tup.checkpoint["channel_values"].values()
        )


# -- reading -----------------------------------------------------------------------------
def test_threads_history_show(endpoint: str, chats) -> None:
    saver, graph = chats
    # A page of one: the newest thread, and where the next page starts.
    page = json.loads(ok(run_cli(endpoint, "--json", "threads", "--limit", "1")))
    listed = [t.thread_id for t in saver.list_threads()]  # both made in the same second: by id
    first, second = listed
    assert [t["thread_id"] for t in page["threads"]] == [first] and page["next_before"] == first
    state = graph.get_state(config(first))
    assert page["threads"][0]["checkpoint_id"] == state.config["configurable"]["checkpoint_id"]
    assert page["threads"][0]["metadata"]["user"] == first[5:] and page["threads"][0]["archived"] is None

    # The next page, filtered on an int (parsed as JSON) and a string.
    state = graph.get_state(config(second))
    step = state.metadata["step"]
    args = ["--before", first, "--filter", f"step={step}", "--filter", f"user={second[5:]}"]
    table = ok(run_cli(endpoint, "threads", *args))
    header, rule, row = table.splitlines()[:3]
    assert header.split()[:3] == ["thread", "created", "latest"] and set(rule) == {"─"}
    assert row.split()[0] == second and state.config["configurable"]["checkpoint_id"] in row and f" {step} " in row
    assert "next page" not in table and first not in table
    bob = graph.get_state(config("chat-bob"))

    # history as JSON equals get_state_history: ids, steps, next nodes, writes.
    doc = json.loads(ok(run_cli(endpoint, "--json", "history", "chat-ann")))
    snapshots = list(graph.get_state_history(config("chat-ann")))
    assert [c["checkpoint_id"] for c in doc["checkpoints"]] == [s.config["configurable"]["checkpoint_id"] for s in snapshots]
    for entry, snapshot in zip(doc["checkpoints"], snapshots):
        tup = saver.get_tuple(snapshot.config)
        assert entry["next"] == sorted(snapshot.next)
        assert entry["step"] == snapshot.metadata["step"] and entry["source"] == snapshot.metadata["source"]
        assert entry["writes"] == len(tup.pending_writes) and entry["size"] == values_size(saver.serde, tup.checkpoint)
        assert entry["parent_checkpoint_id"] == (snapshot.parent_config or {}).get("configurable", {}).get("checkpoint_id")

    # history as a table, a page of two.
    table = ok(run_cli(endpoint, "history", "chat-bob", "--limit", "2"))
    lines = table.splitlines()
    assert lines[0].strip() == "thread chat-bob"
    assert lines[1].split() == ["checkpoint", "time", "step", "source", "next", "writes", "size"]
    rows = [line.split() for line in lines[3:]]
    assert len(rows) == 2 and rows[0][3:6] == ["1", "loop", "review"] and rows[1][3:6] == ["0", "loop", "agent"]

    # show as JSON: what get_state() says of the waiting thread.
    shown = json.loads(ok(run_cli(endpoint, "--json", "show", "chat-bob")))
    assert shown["checkpoint_id"] == bob.config["configurable"]["checkpoint_id"]
    assert shown["next"] == list(bob.next) == ["review"]
    assert [m["content"] for m in shown["values"]["messages"]] == ["hello from bob", "answer 1"]
    assert [m["type"] for m in shown["values"]["messages"]] == ["human", "ai"]
    assert [(i["id"], i["value"]) for i in shown["interrupts"]] == [(i.id, i.value) for i in bob.interrupts]
    assert [w["channel"] for w in shown["pending_writes"]] == ["__interrupt__"]
    assert shown["metadata"]["run_id"] == "bob-1"

    # show as text: messages readable, the interrupt and its question.
    text = ok(run_cli(endpoint, "show", "chat-bob"))
    assert "human hello from bob" in " ".join(text.split()) and "ai    answer 1" in text
    assert bob.interrupts[0].id in text and "approve?" in text and "interrupts (1)" in text

    # An older checkpoint by id, as LangGraph's history shows it (the step's interrupt, answered since).
    older = [s for s in snapshots if s.next == ("review",)][0]
    shown = json.loads(ok(run_cli(endpoint, "--json", "show", "chat-ann", older.config["configurable"]["checkpoint_id"])))
    assert shown["next"] == ["review"] and len(shown["interrupts"]) == 1
    assert any(w["channel"] == "__resume__" for w in shown["pending_writes"])


def test_not_found_is_exit_3(endpoint: str, chats) -> None:
    line = error_line(run_cli(endpoint, "show", "no-such-thread"), 3)
    assert "'no-such-thread'" in line and f"'{BUCKET}'" in line and f"'{TABLE}'" in line
    line = error_line(run_cli(endpoint, "show", "chat-bob", "1f0-no-such-checkpoint"), 3)
    assert "'1f0-no-such-checkpoint'" in line and "'chat-bob'" in line
    assert "'nobody'" in error_line(run_cli(endpoint, "copy", "nobody", "somebody"), 3)


# -- errors and configuration ------------------------------------------------------------
def test_usage_errors_are_exit_2(endpoint: str) -> None:
    result = run_cli(endpoint, "verify", "--older-than", "1x")
    assert result.returncode == 2 and "'1x' is not a duration" in result.stderr.decode()
    result = run_cli(endpoint, "threads", env=cli_env(endpoint, CHECKPOINT_BUCKET=None))
    assert result.returncode == 2 and "--bucket" in result.stderr.decode() and "CHECKPOINT_BUCKET" in result.stderr.decode()
    result = run_cli(endpoint, "--serde", "no_such_module:serde", "threads")
    assert result.returncode == 2 and "'no_such_module'" in result.stderr.decode()


@pytest.mark.parametrize("debug", [False, True])
def test_store_error_is_exit_1_naming_the_bucket(endpoint: str, debug: bool) -> None:
    """A bucket that does not exist (manifest mode reads it first): one line, or a traceback with --debug."""
    args = ["--bucket", "no-such-bucket", "threads"]
    result = run_cli(endpoint, *(["--debug"] if debug else []), *args, mode="manifest")
    if debug:
        stderr = result.stderr.decode()
        assert result.returncode == 1 and "Traceback" in stderr and "BucketNotFoundError" in stderr
        assert stderr.strip().splitlines()[-1].startswith("error: ")
    else:
        line = error_line(result, 1)
        assert "bucket 'no-such-bucket'" in line and "does not exist" in line


def test_a_bucket_gone_or_not_the_tables_owner_is_refused(endpoint: str, chats) -> None:
    """The table alone could answer (DynamoDB mode): the bucket is checked first."""
    for args in (["threads"], ["history", "chat-ann"], ["show", "chat-ann"]):
        line = error_line(run_cli(endpoint, "--bucket", "no-such-bucket", *args), 1)
        assert "bucket 'no-such-bucket'" in line and "does not exist" in line, line
    _s3(endpoint).create_bucket(Bucket="another-app")
    line = error_line(run_cli(endpoint, "--bucket", "another-app", "show", "chat-ann"), 1)
    assert f"'{TABLE}'" in line and f"'{BUCKET}'" in line and "'another-app'" in line, line
    assert "table of its own" in line


def test_serde_option(endpoint: str, monkeypatch) -> None:
    """Threads written with EncryptedSerializer: unreadable without --serde (exit 1), read with
    CHECKPOINT_SERDE naming a zero-argument factory (the key from LANGGRAPH_AES_KEY)."""
    key = "k" * 32
    saver = make_saver(endpoint, serde=EncryptedSerializer.from_pycryptodome_aes(key=key.encode()))
    saver.setup()
    chat_graph(saver).invoke({"messages": [("user", "secret")]}, config("sealed"))
    saver.close()
    line = error_line(run_cli(endpoint, "show", "sealed"), 1)
    factory = "langgraph.checkpoint.serde.encrypted:EncryptedSerializer.from_pycryptodome_aes"
    assert "msgpack+aes" in line and f"pass --serde {factory} " in line and "serde=" not in line
    env = cli_env(endpoint, CHECKPOINT_SERDE=factory, LANGGRAPH_AES_KEY=key)
    shown = json.loads(ok(run_cli(endpoint, "--json", "show", "sealed", env=env)))
    assert shown["values"]["messages"][0]["content"] == "secret"


@pytest.mark.parametrize(
    "index_mode, script", [("dynamodb", True), ("manifest", False)], ids=["dynamodb-console-script", "manifest-python-m"]
)
def test_setup(endpoint: str, index_mode: str, script: bool) -> None:
    """setup makes the bucket (and the table) ready and says which index it uses."""
    out = ok(run_cli(endpoint, "setup", mode=index_mode, script=script, process=True))
    assert f"bucket '{BUCKET}' ready" in out
    _s3(endpoint).head_bucket(Bucket=BUCKET)
    if index_mode == "dynamodb":
        assert f"DynamoDB table '{TABLE}' ready" in out
        boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1").describe_table(TableName=TABLE)
    else:
        assert "manifest" in out


# -- maintenance -------------------------------------------------------------------------
def test_verify_and_gc(endpoint: str) -> None:
    """What the saver's audit finds, as a table, JSON and exit bits (the audit itself is
    tested in both index modes by tests/test_audit.py)."""
    index_mode = "dynamodb"
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    populate(saver)
    s3 = _s3(endpoint)
    orphan = "live/chat-ann/=/checkpoints/orphan-of-a-crashed-write"
    s3.put_object(Bucket=BUCKET, Key=orphan, Body=b"x" * 100)
    ghost = "live/ghost/=/checkpoints/1"
    s3.put_object(Bucket=BUCKET, Key=ghost, Body=b"y" * 50)
    gone = next(
        o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="live/chat-bob/")["Contents"] if "/writes/" in o["Key"]
    )
    s3.delete_object(Bucket=BUCKET, Key=gone)

    # Within the grace period the orphan (and the new thread's object) may be a write
    # in flight: shown, not counted.
    table = ok(run_cli(endpoint, "verify", mode=index_mode), 16)
    assert "in_flight" in table and orphan in table and ghost in table and gone in table
    assert "1 missing, 2 in flight" in table

    report = json.loads(ok(run_cli(endpoint, "--json", "verify", "--older-than", "0s", mode=index_mode), 4 | 8 | 16))
    assert report["counts"] == {"missing": 1, "broken": 0, "orphan": 1, "unindexed": 1, "in_flight": 0}
    assert {(p["kind"], p["key"]) for p in report["problems"]} == {("orphan", orphan), ("unindexed", ghost), ("missing", gone)}
    assert report["exit_code"] == 28 and report["threads"] == 3

    # gc: a dry run by default (verify's bitmask), listing what it would delete.
    out = ok(run_cli(endpoint, "gc", "--older-than", "0s", "-v", mode=index_mode), 4 | 8 | 16)
    assert orphan in out and "would delete 1 object (100 bytes)" in out and ghost not in out.split("not deleted")[0]
    assert _exists(endpoint, orphan)
    # Deleting with a grace period shorter than a write can take needs --force.
    refused = run_cli(endpoint, "gc", "--older-than", "0s", "--yes", mode=index_mode)
    assert refused.returncode == 2 and b"--force" in refused.stderr and _exists(endpoint, orphan)
    done = json.loads(
        ok(run_cli(endpoint, "--json", "gc", "--older-than", "0s", "--yes", "--force", "--include-unindexed", mode=index_mode))
    )
    assert sorted(done["deleted"]) == sorted([orphan, ghost]) and done["delete_bytes"] == 150 and done["exit_code"] == 0
    assert not _exists(endpoint, orphan) and not _exists(endpoint, ghost)

    # Only the threads named; rebuild-index writes one thread's index again.
    assert "consistent" in ok(run_cli(endpoint, "verify", "chat-ann", mode=index_mode))
    assert "no thread 'nobody'" in error_line(run_cli(endpoint, "verify", "chat-ann", "nobody", mode=index_mode), 3)
    assert "indexed 5 checkpoints of thread 'chat-ann'" in ok(run_cli(endpoint, "rebuild-index", "chat-ann", mode=index_mode))
    saver.close()


# -- whole threads -----------------------------------------------------------------------
def test_destructive_commands_need_yes_in_a_pipe(endpoint: str, chats) -> None:
    saver, graph = chats
    before = graph.get_state(config("chat-ann")).values
    for args in (["delete", "chat-ann"], ["delete", "--run", "ann-1"], ["prune", "chat-ann"], ["erase", "chat-ann"]):
        line = error_line(run_cli(endpoint, *args), 2)
        assert "--yes" in line and "nothing was changed" in line
    assert graph.get_state(config("chat-ann")).values == before
    assert len(list(graph.get_state_history(config("chat-ann")))) == 5


def test_copy_prune_delete(endpoint: str, chats) -> None:
    saver, graph = chats
    assert "copied thread 'chat-ann' to 'chat-copy'" in ok(run_cli(endpoint, "copy", "chat-ann", "chat-copy"))
    assert graph.get_state(config("chat-copy")).values == graph.get_state(config("chat-ann")).values
    out = ok(run_cli(endpoint, "prune", "chat-copy", "chat-ann", "--keep-last", "2", "--yes"))
    assert "pruned 2 threads" in out
    assert len(list(graph.get_state_history(config("chat-copy")))) == 2
    out = ok(run_cli(endpoint, "delete", "chat-copy", "--yes"))
    assert "deleted 1 thread: chat-copy" in out and graph.get_state(config("chat-copy")).values == {}
    # delete --run: bob's only run goes, so does his thread from the listing.
    assert json.loads(ok(run_cli(endpoint, "--json", "delete", "--run", "bob-1", "--yes"))) == {"deleted_runs": ["bob-1"]}
    assert saver.get_tuple(config("chat-bob")) is None
    assert [t.thread_id for t in saver.list_threads()] == ["chat-ann"]


def test_deleting_what_does_not_exist_is_exit_3(endpoint: str, chats) -> None:
    line = error_line(run_cli(endpoint, "delete", "no-such-thread", "--yes"), 3)
    assert "no thread 'no-such-thread'" in line and f"'{BUCKET}'" in line
    assert "no checkpoints of run 'nope'" in error_line(run_cli(endpoint, "delete", "--run", "nope", "--yes"), 3)
    # The ids that exist are deleted all the same; the exit code still says one was not found.
    result = run_cli(endpoint, "delete", "chat-bob", "no-such-thread", "--yes")
    assert "deleted 1 thread: chat-bob" in result.stdout.decode()
    assert "'no-such-thread'" in error_line(result, 3)
    assert chats[0].get_tuple(config("chat-bob")) is None
    assert "'chat-bob'" in error_line(run_cli(endpoint, "delete", "chat-bob", "--yes"), 3)  # once is enough


def test_json_errors_are_one_document_on_stdout(endpoint: str, chats) -> None:
    result = run_cli(endpoint, "--json", "show", "no-such-thread")
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "NotFoundError" and error["exit_code"] == 3 == result.returncode
    assert "'no-such-thread'" in error["message"] and error_line(result, 3)  # stderr keeps its line
    result = run_cli(endpoint, "--json", "--bucket", "no-such-bucket", "threads")
    error = json.loads(result.stdout)["error"]
    assert (error["kind"], error["exit_code"], result.returncode) == ("BucketNotFoundError", 1, 1)
    result = run_cli(endpoint, "--json", "history")  # a usage error: THREAD missing
    error = json.loads(result.stdout)["error"]
    assert (error["kind"], error["exit_code"], result.returncode) == ("UsageError", 2, 2) and "THREAD" in error["message"]


def test_hints_name_commands_and_options(endpoint: str, chats, tmp_path) -> None:
    """The library's advice names Python parameters and methods; the command line says its
    options and commands instead (each rule of s3_saver/cli/_messages.py met here where a
    command meets it; test_every_python_name_in_the_librarys_messages_has_its_words below
    covers the rest)."""
    said: list[str] = []

    def error(*args: str) -> str:
        said.append(error_line(run_cli(endpoint, *args), 1))
        return said[-1]

    path = tmp_path / "chat-ann.s3saver"
    ok(run_cli(endpoint, "export", "chat-ann", str(path)))
    line = error("import", str(path))  # chat-ann exists
    assert "--as" in line and "delete THREAD" in line and "`import` imports into an empty thread" in line
    line = error("copy", "chat-ann", "chat-bob")
    assert "delete THREAD" in line and "`copy` copies into an empty thread" in line
    line = error("--bucket", "no-such-bucket", "threads")
    assert "`setup` command" in line and "Check the bucket name and --region" in line
    # (A prefix of its own: the store's prefix belongs to its table, which the marker names first.)
    line = error("--table", "no-such-table", "--prefix", "elsewhere/", "threads")
    assert "check --region (the `setup` command there would create a second, empty index)" in line
    line = error("--table", "no-such-table", "threads")
    assert f"Pass --table {TABLE} (or CHECKPOINT_TABLE={TABLE})" in line and "`rebuild-index` with no thread id" in line
    # The global options as the constructor checks them.
    line = error("--bucket", "s3://checkpoints", "threads")
    assert line.startswith("error: --bucket 's3://checkpoints' is not an S3 bucket name") and "goes in --prefix" in line
    line = error("--table", "a table", "threads")
    assert line.startswith("error: --table 'a table' is not a DynamoDB table name") and "pass --table ''" in line
    line = error("--s3-endpoint-url", "localhost:9000", "threads")
    assert line == "error: --s3-endpoint-url must be an http:// or https:// URL, got 'localhost:9000'"
    # setup next to a bucket of another region: the region to give.
    boto3.client("s3", endpoint_url=endpoint, region_name="eu-west-1").create_bucket(
        Bucket="in-europe", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    line = error("--bucket", "in-europe", "--table", "fresh-table", "setup")
    assert "`setup` created nothing: give --region 'eu-west-1' if the table lives with the bucket" in line
    # An archived thread in a cold class: the command that restores it.
    ok(run_cli(endpoint, "archive", "chat-bob", "--class", "GLACIER"))
    line = error("show", "chat-bob")
    assert "run `restore 'chat-bob'`:" in line and "run it again once done" in line
    # A prefix of the other index mode: the option that reaches it.
    line = error("--table", "", "threads")
    assert f"Pass --table {TABLE} (or CHECKPOINT_TABLE={TABLE})" in line and "command line:" not in line
    # migrate: a saver URL's own words (its parameters) stay.
    line = error_line(run_cli(endpoint, "migrate", "--to", f"s3://{BUCKET}/x?table=a b"), 1)
    assert "the table 'a b' is not a DynamoDB table name" in line and "leave table out of the URL" in line
    assert [line for line in said if PYTHON_NAMES.search(line)] == []


def test_global_options_go_before_or_after_the_command(endpoint: str, chats) -> None:
    """`threads --json` is `--json threads`; after the command, an option wins over the
    environment as before it; given on both sides with two values, it is a usage error."""
    assert json.loads(ok(run_cli(endpoint, "threads", "--json"))) == json.loads(ok(run_cli(endpoint, "--json", "threads")))
    # The store from the command line alone (nothing in the environment), in either order.
    bare = cli_env(endpoint, CHECKPOINT_BUCKET=None, CHECKPOINT_TABLE=None, AWS_ENDPOINT_URL=None, AWS_REGION=None)
    store = ["--bucket", BUCKET, "--table", TABLE, "--endpoint-url", endpoint, "--region", "us-east-1"]
    after = json.loads(ok(run_cli(endpoint, "history", "chat-ann", *store, "--json", env=bare)))
    assert after == json.loads(ok(run_cli(endpoint, *store, "--json", "history", "chat-ann", env=bare)))
    assert len(after["checkpoints"]) == 5
    mixed = ok(run_cli(endpoint, "--bucket", BUCKET, "--endpoint-url", endpoint, "show", "chat-bob", "--table", TABLE, "--region", "us-east-1", env=bare))
    assert "hello from bob" in mixed
    # After the command, over the environment's table: the manifest index of another prefix.
    assert ok(run_cli(endpoint, "threads", "--table", "", "--prefix", "elsewhere/")).strip() == "no threads"
    # Flags after the command: --no-progress, --debug (the traceback of an error).
    result = run_cli(endpoint, "threads", "--no-progress", "--debug", "--bucket", "no-such-bucket")
    assert result.returncode == 1 and "Traceback" in result.stderr.decode() and "BucketNotFoundError" in result.stderr.decode()
    # --json after the command: an error is a JSON document too.
    result = run_cli(endpoint, "show", "no-such-thread", "--json")
    assert json.loads(result.stdout)["error"]["exit_code"] == 3 == result.returncode
    # Twice with one value is that value; with two, which one was meant is not guessed.
    ok(run_cli(endpoint, "--json", "--table", TABLE, "threads", "--json", "--table", TABLE))
    result = run_cli(endpoint, "--bucket", BUCKET, "threads", "--bucket", "another")
    assert result.returncode == 2 and "--bucket is given before the command ('checkpoints') and after it ('another')" in result.stderr.decode()
    # A command's help says they may follow it.
    assert "may follow the command too" in " ".join(ok(run_cli(endpoint, "threads", "--help")).split())


# Thread ids a table cannot show as they are: a line break, a tab, an escape sequence (red
# text), a right-to-left override, a C1 control, a bell.
ODD_IDS = ["line\nbreak", "tab\there", "esc\x1b[31mred", "\u202eevil", "c1\x85control", "bell\x07"]


def test_ids_with_control_characters_are_escaped_in_tables_and_kept_in_json(endpoint: str, index_mode: str) -> None:
    """Tables show such an id as a shell reads it back ($'line\\nbreak'): one line per row,
    nothing the terminal would act on; --json gives the id itself."""
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    populate(saver, users=tuple(ODD_IDS), finished=())
    ids = [f"chat-{odd}" for odd in ODD_IDS]
    escaped = ["$'chat-line\\nbreak'", "$'chat-tab\\there'", "$'chat-esc\\x1b[31mred'", "$'chat-\\u202eevil'", "$'chat-c1\\u0085control'", "$'chat-bell\\x07'"]

    table = ok(run_cli(endpoint, "threads", "--limit", "0", mode=index_mode))
    lines = table.splitlines()
    assert len(lines) == 2 + len(ids)  # header, rule, one line per thread
    assert sorted(line.split()[0] for line in lines[2:]) == sorted(escaped)
    assert all(ch.isprintable() for ch in table.replace("\n", ""))
    listed = json.loads(ok(run_cli(endpoint, "--json", "threads", "--limit", "0", mode=index_mode)))
    assert sorted(t["thread_id"] for t in listed["threads"]) == sorted(ids)

    for thread, shown in list(zip(ids, escaped))[:3]:  # a line break, a tab, an escape sequence
        history = ok(run_cli(endpoint, "history", thread, mode=index_mode))
        assert history.splitlines()[0].strip() == f"thread {shown}" and all(ch.isprintable() for ch in history.replace("\n", ""))
        assert json.loads(ok(run_cli(endpoint, "--json", "history", thread, mode=index_mode)))["thread_id"] == thread
        head = ok(run_cli(endpoint, "show", thread, mode=index_mode)).splitlines()[0]
        assert head.split() == ["thread", shown]
    # What a shell reads back from the table is the id.
    for thread, shown in zip(ids, escaped):
        assert subprocess.run(["bash", "-c", f"printf %s {shown}"], capture_output=True).stdout.decode() == thread

    out = ok(run_cli(endpoint, "delete", "--yes", *ids[:2], mode=index_mode))
    assert out.strip() == f"deleted 2 threads: {escaped[0]}, {escaped[1]}"
    assert json.loads(ok(run_cli(endpoint, "--json", "delete", "--yes", *ids[2:], mode=index_mode))) == {"deleted_threads": ids[2:]}
    saver.close()


# What names a Python parameter or method of the saver in a message: a parameter or method
# followed by "=" or "(", `saver.x`, a method's name with an underscore, `deadline()`.
def _python_names() -> re.Pattern[str]:
    methods = {name for cls in S3Saver.__mro__ if cls.__module__.startswith("s3_saver") for name in vars(cls)}
    methods = {name for name in methods if not name.startswith("_") and callable(getattr(S3Saver, name))}
    names = sorted(methods | set(inspect.signature(S3Saver.__init__).parameters) - {"self"} | {"deadline"}, key=len, reverse=True)
    called = "|".join(map(re.escape, names))
    underscored = "|".join(re.escape(name) for name in names if "_" in name)
    return re.compile(rf"\bsaver\.\w|(?<![\w.-])(?:{called})(?:\(|=)|(?<![\w.-])(?:{underscored})\b")


PYTHON_NAMES = _python_names()

# Messages of the library that name Python things and that the command line never prints
# (what they are about has no command or option), or prints in another way.
NOT_IN_CLI_WORDS = {
    "a directory bucket stores every object": "the live objects' storage class: no option sets it",
    "storage_class 'x' for the live objects": "the live objects' storage class: no option sets it",
    "the async methods cannot use the credentials": "the async methods: the command line calls the sync ones",
    "setup_replica() and promote() refuse a bucket": "a replica's setup and promote: no command does either",
    "replication lag: x checkpoints or pending writes": "promote(): no command promotes a replica",
    "Replica(table='x') needs a DynamoDB index": "Replica(): no option configures a replica",
    "x() needs a replica: build the saver": "Replica(): no option configures a replica",
    "x. The other region (x) has no index": "a replica's reads: no option configures a replica",
    "x: the primary region is unavailable": "a replica's writes: no option configures a replica",
    "S3Store.from_saver: memory items live in DynamoDB table": "Replica(): no option configures a replica",
    "KmsKey endpoint_url must be": "--kms-key: the command line gives KMS the saver's endpoint",
    "sqlite:///relative/path.db or sqlite:////absolute": "saver URLs (migrate --from/--to): their parameters are their words",
    "x: an S3 URL is s3://bucket[/prefix]?table=": "saver URLs (migrate --from/--to): their parameters are their words",
    ". The thread was written with an EncryptedSerializer": "the serializer is a variable here; test_serde_option meets both forms' rule",
    "S3Cache('x', prefix='x')": "S3Cache: the node cache has no command",
    "max_concurrency must be a positive int, got 'x'": "S3Cache(max_concurrency=): the node cache has no command",
}


def _messages_naming_python(tree: ast.AST) -> list[str]:
    """Each string of ``tree`` with a space (a message, not an identifier; docstrings
    aside) that names a Python parameter or method, its placeholders written x or 'x'."""
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    parts = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in parts:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) else ("'x'" if v.conversion == ord("r") else "x") for v in node.values
            )
        else:
            continue
        if " " in text and PYTHON_NAMES.search(text):
            found.append(text)
    return found


def test_every_python_name_in_the_librarys_messages_has_its_words() -> None:
    """Every message of the library that names a Python parameter or method reads, on the
    command line, with the option or command instead (cli_words), or is one the command
    line cannot print. A new message naming one fails here until the CLI has its words."""
    package = Path(s3_saver.__file__).parent
    left = {}
    for path in sorted(package.rglob("*.py")):
        if path.parent.name == "cli":
            continue
        for text in _messages_naming_python(ast.parse(path.read_text())):
            if PYTHON_NAMES.search(cli_words(text)):
                left[text] = path.name
    known = {prefix for prefix in NOT_IN_CLI_WORDS if any(text.startswith(prefix) for text in left)}
    assert [text for text in left if not any(text.startswith(p) for p in NOT_IN_CLI_WORDS)] == []
    assert known == set(NOT_IN_CLI_WORDS)  # each exception still exists
    # Rules no command of the suite meets (a slow table, throttling, another store).
    for python, cli in [
        ("table t did not become ACTIVE within 60 s; run setup() again", "run the `setup` command again"),
        ("t kept refusing 3 items (throttled; gave up within the retry budget and deadline())", "within the retry budget)"),
        ("use a DynamoDB table (table=...) with this store", "use a DynamoDB table (--table) with this store"),
        ("postgresql://me@db/app: setup() failed: boom", "creating or migrating its tables failed: boom"),
        ("Give this saver a table of its own (table=...) or another prefix (prefix=...)", "(--table) or another prefix (--prefix)"),
        ("archive_idle on thread 'a', read from its archive", "`archive --idle` on thread 'a'"),
        ("pass serde=EncryptedSerializer(...) with the key it was written with", "pass --serde MODULE:ATTR naming an"),
        ("Pass the table that indexes them (table=...; command line: --table NAME, or CHECKPOINT_TABLE)", "(--table NAME, or"),
        ("it holds {...}, written once by setup()", "written once by the `setup` command"),
        ("give the saver a table of its own (setup() creates it with that schema)", "(the `setup` command creates it"),
    ]:
        assert cli in cli_words(python) and not PYTHON_NAMES.search(cli_words(python)), python


def test_copy_run_again_succeeds_and_leaves_nothing_to_collect(endpoint: str, chats) -> None:
    for _ in range(2):
        assert "copied thread 'chat-ann' to 'chat-copy'" in ok(run_cli(endpoint, "copy", "chat-ann", "chat-copy"))
    ok(run_cli(endpoint, "verify", "--older-than", "0s"))  # exit 0: no orphan
def _versions_naming(endpoint: str, token: str) -> list[dict]:
    pages = _s3(endpoint).get_paginator("list_object_versions").paginate(Bucket=BUCKET)
    return [v for page in pages for v in page.get("Versions", []) + page.get("DeleteMarkers", []) if token in v["Key"]]


def test_erase_removes_every_version_and_lists_what_a_lock_keeps(endpoint: str, index_mode: str) -> None:
    _s3(endpoint).create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)  # versioned
    saver = make_saver(endpoint, index_mode)
    saver.setup()
    graph = populate(saver)
    out = ok(run_cli(endpoint, "erase", "chat-bob", "--yes", mode=index_mode))
    assert "erased 1 thread" in out and "chat-bob" in out and "remain" not in out
    left = _versions_naming(endpoint, "chat-bob")
    assert len(left) == (1 if index_mode == "manifest" else 0), left  # the manifest's head: its delete record
    assert graph.get_state(config("chat-bob")).values == {} and graph.get_state(config("chat-ann")).values

    held = sorted(o["Key"] for o in _s3(endpoint).list_objects_v2(Bucket=BUCKET, Prefix="live/chat-ann/")["Contents"])[0]
    _s3(endpoint).put_object_legal_hold(Bucket=BUCKET, Key=held, LegalHold={"Status": "ON"})
    doc = json.loads(ok(run_cli(endpoint, "--json", "erase", "chat-ann", "--yes", mode=index_mode), 1))
    assert doc["erased_threads"] == ["chat-ann"] and doc["deleted_versions"] > 0
    assert [(r["key"], r["reason"], r["legal_hold"]) for r in doc["remaining"]] == [(held, "object lock", True)]
    saver.close()


def test_export_import_archive_restore(endpoint: str, chats, tmp_path) -> None:
    saver, graph = chats
    expected = graph.get_state(config("chat-ann")).values
    path = tmp_path / "chat-ann.s3saver"
    assert "exported thread 'chat-ann'" in ok(run_cli(endpoint, "export", "chat-ann", str(path)))
    assert "imported thread 'imported'" in ok(run_cli(endpoint, "import", str(path), "--as", "imported"))
    assert graph.get_state(config("imported")).values == expected
    # FILE "-": the bytes on stdout (the message on stderr), and from stdin: real pipes.
    piped = run_cli(endpoint, "export", "chat-ann", "-", process=True)
    assert piped.returncode == 0 and piped.stdout == path.read_bytes() and b"exported thread" in piped.stderr
    done = json.loads(ok(run_cli(endpoint, "--json", "import", "-", "--as", "piped", stdin=piped.stdout, process=True)))
    assert done["thread_id"] == "piped" and done["bytes"] == len(piped.stdout)
    assert graph.get_state(config("piped")).values == expected
    assert "'absent'" in error_line(run_cli(endpoint, "export", "absent", str(tmp_path / "x")), 3)

    # archive named threads, then restore one; archive --idle takes the idle ones.
    table = ok(run_cli(endpoint, "archive", "imported", "piped", "--class", "STANDARD_IA"))
    assert table.count(" archived ") == 2 and "archive/imported/" in table and "STANDARD_IA" in table
    assert {t.thread_id: t.archived for t in saver.list_threads()}["imported"] == "STANDARD_IA"
    restored = json.loads(ok(run_cli(endpoint, "--json", "restore", "imported")))
    assert restored["state"] == "live" and restored["thread_id"] == "imported"
    assert graph.get_state(config("imported")).values == expected
    idle = json.loads(ok(run_cli(endpoint, "--json", "archive", "--idle", "0s", "--limit", "2")))
    assert len(idle["archived"]) == 2 and all(s["storage_class"] == "GLACIER_IR" for s in idle["archived"])
    archived = {t.thread_id for t in saver.list_threads() if t.archived}
    assert {s["thread_id"] for s in idle["archived"]} <= archived and len(archived) == 3
    assert graph.get_state(config("chat-ann")).values == expected  # archived or not, read the same


# -- migrate -----------------------------------------------------------------------------
def test_migrate_from_sqlite(endpoint: str, tmp_path) -> None:
    """A SQLite file a graph wrote, migrated into the store of the global options: the graph on an
    S3Saver resumes it (the interrupt's answer) to the same state as on SQLite."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    database = tmp_path / "source.db"
    with sqlite3.connect(database, check_same_thread=False) as conn:
        source = SqliteSaver(conn)
        source.setup()
        populate(source, users=("ann", "bob", "cid"), finished=("ann",))
    saver = make_saver(endpoint)
    saver.setup()
    out = ok(run_cli(endpoint, "migrate", "--from", f"sqlite:///{database}", "--thread", "chat-bob", "--thread", "chat-ann"))
    lines = out.splitlines()
    assert lines[0] == f"from sqlite:///{database}" and lines[1] == f"to   s3://{BUCKET}/?table={TABLE}"
    assert lines[2].split() == ["threads", "checkpoints", "writes", "skipped", "bytes", "verified", "seconds"]
    threads, checkpoints, writes, skipped, _, _, verified, _ = lines[4].split()
    assert (threads, checkpoints, skipped, verified) == ("2", "8", "0", "8") and int(writes) > 0  # 5 + 3 checkpoints
    assert saver.get_tuple(config("chat-cid")) is None
    with sqlite3.connect(database, check_same_thread=False) as conn:
        on_sqlite = chat_graph(SqliteSaver(conn))
        on_s3 = chat_graph(saver)
        for thread in ("chat-ann", "chat-bob"):
            assert on_s3.get_state(config(thread)).values == on_sqlite.get_state(config(thread)).values
            assert on_s3.get_state(config(thread)).next == on_sqlite.get_state(config(thread)).next
        assert on_s3.invoke(Command(resume="ok"), config("chat-bob")) == on_sqlite.invoke(Command(resume="ok"), config("chat-bob"))
    # Without --from: from the store of the global options, here to another prefix in manifest mode.
    url = f"s3://{BUCKET}/copies/?endpoint_url={endpoint}&region=us-east-1"
    moved = json.loads(ok(run_cli(endpoint, "--json", "migrate", "--to", url, "--thread", "chat-ann", "--no-verify", "--workers", "1")))
    assert moved["from"] == f"s3://{BUCKET}/?table={TABLE}" and moved["to"] == url
    assert (moved["threads"], moved["checkpoints"], moved["skipped"], moved["verified"]) == (1, 5, 0, 0)
    copies = S3Saver(BUCKET, prefix="copies/", endpoint_url=endpoint, region_name="us-east-1")
    assert chat_graph(copies).get_state(config("chat-ann")).values == on_s3.get_state(config("chat-ann")).values
    copies.close()
    # A source that is not there is an error (not an empty database), and a store onto itself a usage error.
    line = error_line(run_cli(endpoint, "migrate", "--from", f"sqlite:///{tmp_path / 'typo.db'}"), 1)
    assert "no SQLite database file" in line and "typo.db" in line and not (tmp_path / "typo.db").exists()
    # The same bucket and prefix in the other index mode is the same store (the same object keys).
    same = error_line(run_cli(endpoint, "migrate", "--to", f"s3://{BUCKET}?endpoint_url={endpoint}&region=us-east-1"), 1)
    assert "the same store" in same and f"s3://{BUCKET}/" in same
    refused = run_cli(endpoint, "migrate", "--from", f"sqlite:///{database}", "--workers", "0")
    assert refused.returncode == 2 and "Invalid value for '--workers': 0" in refused.stderr.decode()
    saver.close()


def test_encrypted_threads_read_with_local_key_or_kms_key(endpoint: str, index_mode: str) -> None:
    """Threads a saver wrote with encryption= read on the command line with the same key
    (--local-key: the master key from S3_SAVER_LOCAL_KEY; --kms-key), and are refused
    without it in its own words; the two options together, or --key-bucket alone, are
    usage errors."""
    import base64
    import os

    from s3_saver import KmsKey, LocalKey

    master = base64.b64encode(os.urandom(32)).decode()
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description="s3_saver cli test")["KeyMetadata"]["KeyId"]
    for flag, encryption in (("--local-key", LocalKey(master)), ("--kms-key", KmsKey(key_id))):
        thread = f"secret-{flag[2:]}"
        saver = make_saver(endpoint, index_mode, encryption=encryption)
        saver.setup()
        graph = chat_graph(saver)
        graph.invoke({"messages": [("user", "tea please")]}, config(thread))
        saver.close()
        env = {**cli_env(endpoint, index_mode), "S3_SAVER_LOCAL_KEY": master}
        args = (flag,) if flag == "--local-key" else (flag, key_id)
        shown = ok(run_cli(endpoint, *args, "show", thread, "--json", mode=index_mode, env=env))
        assert "tea please" in shown
        line = error_line(run_cli(endpoint, "show", thread, mode=index_mode, env=env), 1)
        assert "give the one it was written with" in line and "encryption=" not in line, line
    both = run_cli(endpoint, "--local-key", "--kms-key", key_id, "threads", mode=index_mode, env={**cli_env(endpoint, index_mode), "S3_SAVER_LOCAL_KEY": master})
    assert both.returncode == 2 and "give one" in both.stderr.decode()
    alone = run_cli(endpoint, "--key-bucket", "k", "threads", mode=index_mode)
    assert alone.returncode == 2 and "--key-bucket" in alone.stderr.decode()


def test_rewrap_wraps_every_key_under_the_new_key(endpoint: str, index_mode: str) -> None:
    """`rewrap --to-kms-key KEY` and `--to-local-key` (the new master key from
    S3_SAVER_NEW_LOCAL_KEY): asks, refuses in a pipe without --yes, then wraps; run again
    it wraps nothing; the threads read with the new key."""
    import base64
    import os

    from s3_saver import LocalKey

    old, new = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
    saver = make_saver(endpoint, index_mode, encryption=LocalKey(old))
    saver.setup()
    chat_graph(saver).invoke({"messages": [("user", "tea please")]}, config("rotated"))
    saver.close()
    env = {**cli_env(endpoint, index_mode), "S3_SAVER_LOCAL_KEY": old, "S3_SAVER_NEW_LOCAL_KEY": new}
    refused = run_cli(endpoint, "--local-key", "rewrap", "--to-local-key", mode=index_mode, env=env)
    assert refused.returncode == 2 and "--yes" in refused.stderr.decode()
    assert "tea please" in ok(run_cli(endpoint, "--local-key", "show", "rotated", "--json", mode=index_mode, env=env))
    done = json.loads(ok(run_cli(endpoint, "--local-key", "rewrap", "--to-local-key", "--yes", "--json", mode=index_mode, env=env)))
    assert (done["rewrapped"], done["already"], done["erased"]) == (1, 0, 0)
    assert done["kek"] == f"local:{LocalKey(new).fingerprint}"
    again = ok(run_cli(endpoint, "--local-key", "rewrap", "--to-local-key", "--yes", mode=index_mode, env=env))
    assert again.startswith("wrapped 0 keys anew") and "1 under it already" in again
    moved = {**env, "S3_SAVER_LOCAL_KEY": new}
    assert "tea please" in ok(run_cli(endpoint, "--local-key", "show", "rotated", "--json", mode=index_mode, env=moved))
    line = error_line(run_cli(endpoint, "--local-key", "show", "rotated", mode=index_mode, env=env), 1)
    assert "rewrap" in line and "encryption=" not in line, line
    # To KMS: the new key named on the command line; the old local one still from the environment.
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description="s3_saver cli rewrap")["KeyMetadata"]["KeyId"]
    to_kms = json.loads(ok(run_cli(endpoint, "--local-key", "rewrap", "--to-kms-key", key_id, "--yes", "--json", mode=index_mode, env=moved)))
    assert to_kms["rewrapped"] == 1 and key_id in to_kms["kek"]
    assert "tea please" in ok(run_cli(endpoint, "--kms-key", key_id, "show", "rotated", "--json", mode=index_mode, env=moved))
    # Usage: one new key, and the current one given.
    assert run_cli(endpoint, "--local-key", "rewrap", "--yes", mode=index_mode, env=env).returncode == 2
    none = run_cli(endpoint, "rewrap", "--to-local-key", "--yes", mode=index_mode, env=env)
    assert none.returncode == 2 and "--kms-key" in none.stderr.decode()
