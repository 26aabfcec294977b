"""The command line's ``memory`` commands against the moto server, in both index modes: run in
this process through the entry point (``run_cli``, as tests/test_cli.py), on items an
S3Store wrote; each run checks its output, its exit code and the store afterwards."""

from __future__ import annotations

import json

from cli_support import error_line, ok, run_cli
from conftest import TABLE
from test_store_s3 import make_store

from s3_saver import S3Store

_OTHER = {"dynamodb": "manifest", "manifest": "dynamodb"}


def _filled(endpoint: str, mode: str) -> S3Store:
    store = make_store(endpoint, mode)
    store.setup()
    store.put(("users", "ann"), "pref", {"text": "likes tea"})
    store.put(("users", "ann", "notes"), "n1", {"text": "lives in Oslo"}, ttl=60)
    store.put(("users", "bob smith"), "line\nbreak", {"text": "coffee"})
    store.put(("teams",), "t", {"size": 3})
    return store


def test_memory_namespaces_show_delete(endpoint: str, index_mode: str) -> None:
    store = _filled(endpoint, index_mode)
    run = lambda *args: run_cli(endpoint, *args, mode=index_mode)

    assert ok(run("memory", "namespaces")).splitlines() == ["teams", "users.ann", "users.ann.notes", "users.bob smith"]
    listed = json.loads(ok(run("memory", "namespaces", "--ns", "users", "--max-depth", "2", "--json")))
    assert listed == {"namespaces": [["users", "ann"], ["users", "bob smith"]]}
    assert ok(run("memory", "namespaces", "--ns", "nobody")).strip() == "no namespaces under nobody"

    # --ns repeated or dotted; a key with a line break shown as a shell reads it back.
    doc = json.loads(ok(run("--json", "memory", "show", "--ns", "users", "--ns", "ann", "pref")))
    item = store.get(("users", "ann"), "pref")
    assert doc == {
        "namespace": ["users", "ann"],
        "key": "pref",
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
        "value": {"text": "likes tea"},
    }
    shown = ok(run("memory", "show", "--ns", "users.bob smith", "line\nbreak"))
    assert "users.bob smith" in shown and "$'line\\nbreak'" in shown and "'coffee'" in shown

    # Not found: exit 3 naming the item and the store; a bad label: a usage error.
    line = error_line(run("memory", "show", "--ns", "users.ann", "nope"), 3)
    assert "no item 'nope' of namespace users.ann in bucket" in line
    assert "an empty label" in run("memory", "show", "--ns", "users..ann", "k").stderr.decode()
    assert run("memory", "show", "--ns", "users..ann", "k").returncode == 2
    assert run("memory", "show", "pref").returncode == 2  # --ns is required

    # delete: --yes in a pipe, the item gone, then nothing to delete (exit 3).
    line = error_line(run("memory", "delete", "--ns", "users.ann", "pref"), 2)
    assert "--yes" in line and "nothing was changed" in line and store.get(("users", "ann"), "pref") is not None
    assert ok(run("memory", "delete", "--ns", "users.ann", "pref", "--yes")).strip() == "deleted item 'pref' of namespace users.ann"
    assert store.get(("users", "ann"), "pref") is None
    assert "nothing to delete" in error_line(run("memory", "delete", "--ns", "users.ann", "pref", "--yes"), 3)
    doc = json.loads(ok(run("memory", "delete", "--ns", "teams", "t", "--yes", "--json")))  # --json after the command
    assert doc == {"deleted": {"namespace": ["teams"], "key": "t"}}
    store.close()


def test_memory_export_import_into_the_other_index_mode(endpoint: str, index_mode: str, tmp_path) -> None:
    source = _filled(endpoint, index_mode)
    other = _OTHER[index_mode]
    into = ["--prefix", "copies/", "--table", "" if other == "manifest" else TABLE]
    with make_store(endpoint, other, "copies/") as target:
        target.setup()
    path = tmp_path / "users.jsonl"

    out = ok(run_cli(endpoint, "memory", "export", str(path), "--ns", "users", mode=index_mode))
    assert out.strip() == f"exported 3 items under users to {path}: {path.stat().st_size:,} bytes"
    out = ok(run_cli(endpoint, *into, "memory", "import", str(path), mode=index_mode))
    assert out.startswith(f"imported 3 items of 3 namespaces from {path}")
    with make_store(endpoint, other, "copies/") as target:
        assert target.list_namespaces() == [("users", "ann"), ("users", "ann", "notes"), ("users", "bob smith")]
        assert target.get(("users", "ann"), "pref") == source.get(("users", "ann"), "pref")
    # Run again: everything there already. JSON: the report.
    doc = json.loads(ok(run_cli(endpoint, *into, "--json", "memory", "import", str(path), mode=index_mode)))
    assert (doc["written"], doc["unchanged"], doc["namespaces"], doc["file"]) == (0, 3, 3, str(path))

    # FILE "-": the export on stdout (its message on stderr), and an import from stdin.
    piped = run_cli(endpoint, "memory", "export", "-", mode=index_mode)
    assert piped.returncode == 0 and b"exported 4 items:" in piped.stderr and piped.stdout.count(b"\n") == 6
    out = ok(run_cli(endpoint, *into, "memory", "import", "-", stdin=piped.stdout, mode=index_mode))
    assert "imported 1 item of 4 namespaces from - (3 there already)" in out

    # A file cut short: exit 1, naming what is wrong and where; nothing written.
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join(path.read_bytes().split(b"\n")[:3]) + b"\n")
    line = error_line(run_cli(endpoint, "--prefix", "fresh/", "memory", "import", str(cut), mode=index_mode), 1)
    assert "`memory import`: cut short: no end line after line 3 (2 items read)" in line
    absent = run_cli(endpoint, "memory", "import", str(tmp_path / "absent"), mode=index_mode)
    assert absent.returncode == 2 and "does not exist" in absent.stderr.decode()
    source.close()


def test_memory_gc(endpoint: str, index_mode: str) -> None:
    """``memory gc``: a dry run names the value objects no item names (exit 4), deleting
    under 15 minutes of grace needs --force (exit 2), --yes deletes (exit 0), and the
    items' own value objects stay."""
    import base64
    import secrets

    import boto3
    from conftest import BUCKET

    from s3_saver._format.memory.names import node_id

    store = _filled(endpoint, index_mode)
    big = {"text": base64.b64encode(secrets.token_bytes(90_000)).decode()}  # an object of its own in both modes
    store.put(("users", "ann"), "doc", big)
    stray = f"memory/n/{node_id(('users', 'ann'))}/@v/{secrets.token_hex(16)}"  # what a put cut short leaves
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.put_object(Bucket=BUCKET, Key=stray, Body=b"x" * 70_000)
    run = lambda *args: run_cli(endpoint, *args, mode=index_mode)

    out = ok(run("memory", "gc"), 0)  # an hour's grace: nothing is old enough
    assert "0 value objects no item names, 2 younger than 1h" in out and "would delete 0 objects" in out
    dry = json.loads(ok(run("memory", "gc", "--older-than", "0s", "--json"), 4))
    assert dry["would_delete"] == [stray] and dry["delete_bytes"] == 70_000 and dry["dry_run"] and dry["finished"]
    assert dry["exit_code"] == 4 and dry["broken"] == [] and dry["namespaces"] == 1
    assert "--force" in run("memory", "gc", "--older-than", "0s", "--yes").stderr.decode()
    assert run("memory", "gc", "--older-than", "0s", "--yes").returncode == 2
    out = ok(run("memory", "gc", "--older-than", "0s", "--yes", "--force", "-v"))
    assert stray in out and "deleted 1 object (70.0 kB)" in out
    assert [k["Key"] for k in s3.list_objects_v2(Bucket=BUCKET, Prefix=stray).get("Contents", [])] == []
    assert store.get(("users", "ann"), "doc").value == big
    store.close()
