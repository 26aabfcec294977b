"""Two savers on one bucket never take each other's objects, whatever their prefixes.

Every key a saver writes is ``<prefix><folder>/...`` (``live``, ``manifests``, ``listing``,
``archive``, ``set-aside``). A prefix that has a folder name as a segment would lie inside
another saver's tree (``live/a`` inside the tree of prefix ``""``), where the outer saver
would read ``live/a/live/blobs/=/checkpoints/<id>`` as a value of its thread ``a``: such a
prefix is refused at construction. Objects an earlier version wrote under one (it accepted
them) are never parsed, collected, erased, listed or indexed by the outer saver: opened with
``open_saver(url, create=False)``, their threads move to another prefix with ``migrate``.
"""

from __future__ import annotations

import json
import secrets
import string
from datetime import timedelta

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_support import cli_env, error_line, ok, run_cli
from conftest import BUCKET, TABLE, make_saver
from helpers import checkpoint, config
from s3_saver import ConfigurationError, open_saver
from s3_saver._format.keys import FOLDERS, KeyLayout, LegacyPrefix, encode
from soundness_support import shifted_clock

NOW = timedelta(0)
LATER = 2 * 3600.0  # past erase's and gc's grace period


def _keys(endpoint: str, prefix: str = "") -> set[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"] for p in pages for o in p.get("Contents", [])}


def _fill(saver, thread_id: str, steps: int = 3, size: int = 80_000) -> list[str]:
    """Checkpoints with a value of ``size`` characters (above the default inline
    threshold: an object of its own) and a task's pending writes; returns the
    checkpoint ids."""
    stored = config(thread_id)
    ids: list[str] = []
    version = None
    for step in range(steps):
        version = saver.get_next_version(version, None)
        big = secrets.token_hex(size // 2)
        cp = checkpoint({"doc": big, "n": step}, {"doc": version, "n": version})
        stored = saver.put(stored, cp, {"source": "loop", "step": step}, {"doc": version, "n": version})
        saver.put_writes(stored, [("n", step + 100)], task_id=f"task-{step}")
        ids.append(cp["id"])
    return ids


def _reads_whole(saver, thread_id: str, ids: list[str], size: int = 80_000) -> None:
    """Every checkpoint of the thread reads, values and pending writes with it."""
    listed = list(saver.list(config(thread_id)))
    assert [t.checkpoint["id"] for t in listed] == ids[::-1]
    for t in listed:
        got = saver.get_tuple(t.config)
        assert len(got.checkpoint["channel_values"]["doc"]) == size
        assert [w[1:] for w in got.pending_writes] == [("n", got.checkpoint["channel_values"]["n"] + 100)]


# -- refused -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prefix", "segment", "outer_prefix"),
    [
        ("live/a", "live", ""),  # the issue's: inside the live/ of prefix ""
        ("live/", "live", ""),
        ("prod/archive/", "archive", "prod/"),
        ("apps/Manifests/x", "Manifests", "apps/"),  # a store on a case-insensitive disk
        ("listing", "listing", ""),
        ("a/b/set-aside/c", "set-aside", "a/b/"),
    ],
)
def test_a_prefix_inside_another_savers_folders_is_refused_before_anything_is_written(
    endpoint: str, index_mode: str, prefix: str, segment: str, outer_prefix: str
) -> None:
    """Nothing of the refused saver reaches the bucket; the saver it would lie inside
    (here with a thread of its own) is the one the message names."""
    table = TABLE if index_mode == "dynamodb" else None
    outer = make_saver(endpoint, index_mode, prefix=outer_prefix)
    outer.setup()
    _fill(outer, "a", 1)
    before = _keys(endpoint)
    with pytest.raises(ConfigurationError) as refused:
        make_saver(endpoint, index_mode, prefix=prefix)
    message = str(refused.value)
    assert f"prefix {prefix!r} of bucket {BUCKET!r}" in message and f"segment {segment!r}" in message
    assert f"with prefix {outer_prefix!r}" in message  # the saver it would lie inside
    # How to move what an earlier version stored there: the command line's migrate.
    source = f"s3://{BUCKET}/{prefix.rstrip('/')}/" + (f"?table={table}" if table else "")
    assert f"migrate --from '{source}'" in message
    # The command line refuses it alike, its setup too, before any request.
    run = run_cli(endpoint, "--prefix", prefix, "setup", mode=index_mode)
    assert f"segment {segment!r}" in error_line(run, 1)
    assert _keys(endpoint) == before
    outer.close()


@pytest.mark.parametrize("prefix", ["./a", "a/../b", "a/.."])
def test_a_prefix_with_dot_segments_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=r"segment '\.\.?'"):
        make_saver("http://127.0.0.1:9", "manifest", prefix=prefix)


@pytest.mark.parametrize("prefix", ["p", "p/", "a/b", "lives/x", "x/archives", "x-live/set-aside-2", "/p", "a//b"])
def test_prefixes_without_a_folder_name_segment_are_accepted(prefix: str) -> None:
    saver = make_saver("http://127.0.0.1:9", "manifest", prefix=prefix)
    assert saver._location()[1] == (prefix if prefix.endswith("/") else prefix + "/")


# -- what an earlier version stored inside another saver's folders -----------------------------
@pytest.fixture
def nested(endpoint: str, index_mode: str):
    """The issue's store: saver A (prefix ""), and objects an earlier version wrote under
    prefix "live/a" (inside A's live/) for threads "blobs" and "writes". A has a thread
    "a", whose folder live/a/ holds all of them."""
    outer = make_saver(endpoint, index_mode)
    outer.setup()
    inner = make_saver(endpoint, index_mode, prefix=LegacyPrefix("live/a"))
    inner.setup()
    stored = {t: _fill(inner, t) for t in ("blobs", "writes")}
    mine = _fill(outer, "a", 2)
    inner_keys = _keys(endpoint, "live/a/live/") | _keys(endpoint, "live/a/manifests/")
    # The key the issue names: read as a value of thread "a" by the parsing of before.
    assert f"live/a/live/blobs/=/checkpoints/{stored['blobs'][0]}" in inner_keys
    yield outer, inner, stored, mine
    outer.close()
    inner.close()


def _inner_intact(endpoint: str, index_mode: str, stored: dict[str, list[str]]) -> None:
    reader = make_saver(endpoint, index_mode, prefix=LegacyPrefix("live/a"))
    for thread_id, ids in stored.items():
        _reads_whole(reader, thread_id, ids)
    assert reader.audit(older_than=NOW).problems == []
    reader.close()


def test_erase_of_the_thread_around_a_nested_prefix_leaves_its_objects(endpoint, index_mode, nested, monkeypatch) -> None:
    outer, inner, stored, mine = nested
    before = _keys(endpoint, "live/a/live/")
    with shifted_clock(monkeypatch) as offset:
        offset[0] = LATER  # every object older than the grace period
        report = outer.erase_thread("a")
    assert _keys(endpoint, "live/a/live/") == before
    _inner_intact(endpoint, index_mode, stored)
    # The thread's own objects went; the nested ones are reported, never deleted.
    assert not {k for k in _keys(endpoint, "live/a/") if not k.startswith(("live/a/live/", "live/a/manifests/", "live/a/listing/"))}
    kept = {r.key for r in report.remaining if r.reason == "a key of a saver whose prefix lies inside this one's folders"}
    assert {f"live/a/live/blobs/=/checkpoints/{i}" for i in stored["blobs"]} <= kept
    assert all(k.startswith("live/a/") for k in kept) and not report.complete
    assert outer.get_tuple(config("a")) is None


def test_gc_never_collects_a_nested_prefix_s_objects(endpoint, index_mode, nested) -> None:
    outer, inner, stored, mine = nested
    before = _keys(endpoint, "live/a/")
    report = outer.collect_garbage(older_than=NOW, include_unindexed=True)
    assert report.deleted == [] and report.problems == []
    assert any("live/a/" in note and "migrate" in note for note in report.notes), report.notes
    assert _keys(endpoint, "live/a/") == before
    # The command line's gc, as an operator runs it.
    env = cli_env(endpoint, index_mode)
    done = json.loads(
        ok(run_cli(endpoint, "--json", "gc", "--older-than", "0s", "--yes", "--force", "--include-unindexed", env=env))
    )
    assert done["deleted"] == [] and done["exit_code"] == 0
    assert _keys(endpoint, "live/a/") == before
    _inner_intact(endpoint, index_mode, stored)
    assert [t.checkpoint["id"] for t in outer.list(config("a"))] == mine[::-1]


def test_rebuild_and_list_threads_never_take_a_nested_prefix_s_threads(endpoint, index_mode, nested) -> None:
    outer, inner, stored, mine = nested
    assert {t.thread_id for t in outer.list_threads()} == {"a"}
    assert outer.rebuild_index() == len(mine)
    fresh = make_saver(endpoint, index_mode)
    assert {t.thread_id for t in fresh.list_threads()} == {"a"}
    _reads_whole(fresh, "a", mine)
    assert fresh.audit(older_than=NOW).problems == []
    _inner_intact(endpoint, index_mode, stored)


@pytest.mark.slow  # SeaweedFS holds some conditional PUTs for a 5 s read timeout: 20-30 s
def test_on_seaweedfs_a_nested_prefix_survives_erase_gc_and_rebuild(seaweedfs_bucket, monkeypatch) -> None:
    """The manifest mode's store of choice lists and deletes as S3 does: the same holds there."""
    from conftest import seaweedfs_saver

    endpoint, bucket = seaweedfs_bucket
    small = {"inline_threshold": 100}  # values of 400 characters are objects of their own
    outer = seaweedfs_saver(endpoint, bucket, **small)
    outer.setup()
    inner = seaweedfs_saver(endpoint, bucket, prefix=LegacyPrefix("live/a"), **small)
    mine = _fill(outer, "a", 2, 400)
    stored = {t: _fill(inner, t, 2, 400) for t in ("blobs", "writes")}
    outer.delete_thread("a")
    _fill(outer, "b", 1, 400)
    with shifted_clock(monkeypatch) as offset:
        offset[0] = LATER
        report = outer.erase_thread("a")
        garbage = outer.collect_garbage(older_than=NOW, include_unindexed=True)
        outer.rebuild_index()
    assert len(mine) == 2 and not report.complete and garbage.deleted == []
    assert {t.thread_id for t in outer.list_threads()} == {"b"}
    reader = seaweedfs_saver(endpoint, bucket, prefix=LegacyPrefix("live/a"))
    for thread_id, ids in stored.items():
        _reads_whole(reader, thread_id, ids, 400)
    for saver in (outer, inner, reader):
        saver.close()


def test_migrate_moves_a_nested_prefix_s_threads_out(endpoint, index_mode, nested) -> None:
    """The way out the refusal's message gives: the command line's migrate, from the
    refused prefix (opened to be read) to one of its own."""
    outer, inner, stored, mine = nested
    table = f"?table={TABLE}" if index_mode == "dynamodb" else ""
    with pytest.raises(ConfigurationError, match="segment 'live'"):
        open_saver(f"s3://{BUCKET}/live/a{table}")  # a target is never a refused prefix
    target = make_saver(endpoint, index_mode, prefix="apps/a")
    target.setup()
    env = cli_env(endpoint, index_mode)
    ok(run_cli(endpoint, "migrate", "--from", f"s3://{BUCKET}/live/a/{table}", "--to", f"s3://{BUCKET}/apps/a{table}", env=env))
    for thread_id, ids in stored.items():
        _reads_whole(target, thread_id, ids)
    target.close()


# -- properties ---------------------------------------------------------------------------------
_SEGMENT = st.one_of(
    st.sampled_from(["a", "p", "blobs", "checkpoints", "writes", "segments", "head", "threads", "runs", "=", "-"]),
    st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=6).filter(lambda s: s.strip(".")),
)
_FOLDER_LIKE = st.sampled_from([*FOLDERS, "Live", "ARCHIVE"])
_ID = st.one_of(
    st.sampled_from(["a", "blobs", "writes", "checkpoints", "live", "archive", "manifests", "listing", "set-aside", "head"]),
    st.text(min_size=1, max_size=8).filter(lambda s: "\U0010ffff" not in s and s.encode("utf-8", "ignore") == s.encode("utf-8", "surrogatepass")),
)


@st.composite
def _prefix(draw, segments=_SEGMENT) -> str:
    parts = draw(st.lists(st.one_of(segments, _FOLDER_LIKE, st.just("")), max_size=3))
    return "/".join(parts) + draw(st.sampled_from(["", "/"])) if parts else ""


def _accepted(prefix: str) -> KeyLayout | None:
    try:
        return KeyLayout(prefix)
    except ConfigurationError:
        return None


def _every_key(layout: KeyLayout, thread_id: str, other: str) -> list[str]:
    """One key of every kind the layout builds for the thread (``other``: a second id
    used as namespace, channel, version, checkpoint, task and run)."""
    return [
        layout.checkpoint_key(thread_id, other, other),
        layout.checkpoint_key(thread_id, "", other, tag="0a1b"),
        layout.blob_key(thread_id, other, other, other, other),
        layout.blob_key(thread_id, "", "checkpoints", 3, other),
        layout.writes_key(thread_id, other, other, other, "r0", "ab12"),
        layout.manifest_head_key(thread_id),
        layout.erase_key(thread_id, "ab12"),
        layout.segment_key(thread_id, 1, "ab12"),
        layout.activity_cursor_key("walk"),
        layout.probe_key("ab12"),
        layout.mode_marker_key,
        layout.archive_key(thread_id, "ab12"),
        layout.set_aside_key(thread_id, "ab12"),
        layout.listing_key(1_700_000_000, thread_id),
        layout.activity_key(20261127, thread_id),
        layout.activity_key(20261127, thread_id, "ab12cd34"),
        layout.run_key(other, thread_id),
    ]


def _taken(layout: KeyLayout, key: str, runs: tuple[str, ...]) -> bool:
    """Whether any of the layout's parsers takes ``key`` for one of its own (of the run
    hints, those of ``runs``)."""
    return (
        layout.parse_object_key(key) is not None
        or layout.thread_of_manifest(key) is not None
        or layout.thread_of_archive(key) is not None
        or layout.thread_of_set_aside(key) is not None
        or layout.parse_listing_key(key) is not None
        or layout.parse_activity_key(key) is not None
        or any(layout.thread_of_run(r, key) is not None for r in runs)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(a=_prefix(), b=_prefix(), thread_id=_ID, other=_ID)
def test_two_accepted_prefixes_have_disjoint_trees(a: str, b: str, thread_id: str, other: str) -> None:
    """No key of one accepted saver starts with another's folders (so no listing of one
    ever returns the other's keys), and none is parsed as the other's."""
    outer, inner = _accepted(a), _accepted(b)
    if outer is None or inner is None or outer.prefix == inner.prefix:
        return
    roots = [outer.prefix + f + "/" for f in FOLDERS]
    for key in _every_key(inner, thread_id, other):
        assert not key.startswith(tuple(roots)), (a, b, key)
        assert not _taken(outer, key, (thread_id, other)), (a, b, key)
    # Its own keys are its own; only ids named as folders can make one look like a nested
    # saver's (a namespace "archive" with a checkpoint under it): then it is never taken.
    if not {encode(thread_id), encode(other)} & set(FOLDERS):
        own = [k for k in _every_key(outer, thread_id, other) if not any(n in k for n in ("#active", ".setup-probe", "#index-mode"))]
        assert all(_taken(outer, k, (other,)) for k in own), (a, thread_id, other)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(a=_prefix(), folder=st.sampled_from(FOLDERS), rest=st.lists(_SEGMENT, max_size=2), thread_id=_ID, other=_ID)
def test_keys_under_a_nested_prefix_are_never_parsed_as_the_outer_savers(
    a: str, folder: str, rest: list[str], thread_id: str, other: str
) -> None:
    """What an earlier version wrote under a prefix inside an accepted saver's folder:
    none of those keys is the outer saver's, whatever the ids."""
    outer = _accepted(a)
    if outer is None:
        return
    inner = KeyLayout(outer.prefix + "/".join([folder, *rest]), nested=True)
    for key in _every_key(inner, thread_id, other):
        assert not _taken(outer, key, (thread_id, other)), (outer.prefix, inner.prefix, key)
        if key.startswith(tuple(outer.prefix + f + "/" for f in FOLDERS)):
            assert outer.nested_prefix(key) is not None, key


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    outer_prefix=st.sampled_from(["", "app", "app/x"]),
    folder=st.sampled_from(FOLDERS),
    inner_thread=st.sampled_from(["blobs", "writes", "checkpoints", "head", "t"]),
    outer_thread=st.sampled_from(["a", "blobs", "live"]),
)
def test_a_nested_prefix_survives_the_outer_savers_erase_gc_and_rebuild(
    moto_endpoint: str, monkeypatch, outer_prefix: str, folder: str, inner_thread: str, outer_thread: str
) -> None:
    """End to end in both modes, over drawn prefixes and ids: the outer saver's erase of
    the thread whose folder holds the nested prefix, its gc and its rebuild leave every
    nested object, and the nested threads read whole."""
    import urllib.request

    for mode in ("dynamodb", "manifest"):
        urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).close()
        outer = make_saver(moto_endpoint, mode, prefix=outer_prefix)
        outer.setup()
        where = (outer_prefix + "/" if outer_prefix else "") + f"{folder}/{encode(outer_thread)}"
        inner = make_saver(moto_endpoint, mode, prefix=LegacyPrefix(where))
        inner.setup()
        ids = _fill(inner, inner_thread, 2)
        _fill(outer, outer_thread, 1)
        layout = KeyLayout(where, nested=True)
        before = {k for k in _keys(moto_endpoint, where + "/") if layout.builds(k)}
        with shifted_clock(monkeypatch) as offset:
            offset[0] = LATER  # every object older than the grace period
            outer.erase_thread(outer_thread)
            outer.collect_garbage(older_than=NOW, include_unindexed=True)
            outer.rebuild_index()
        assert {t.thread_id for t in outer.list_threads()} <= {outer_thread}
        assert _keys(moto_endpoint, where + "/") >= before
        _reads_whole(make_saver(moto_endpoint, mode, prefix=LegacyPrefix(where)), inner_thread, ids)
        outer.close()
        inner.close()
