"""S3Store.export_memory / import_memory on moto: a round trip from each index mode into the
other and back (times, TTL, large values, vectors kept), an import cut after each of its
round trips and run again, the vectors carried or computed again, and bad files named.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import pytest
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from store_reference import FakeTime, HashEmbeddings
from test_store_s3 import _Cut, _cut_after, make_store

from s3_saver import CorruptObjectError, MemoryImportReport, SerializationError
from s3_saver._format.memory import ttl
from s3_saver._format.memory.export import decode_export
from s3_saver._store.store import S3Store

INDEX = {"dims": 4, "embed": HashEmbeddings(4), "fields": ["text"]}
OTHER = {"dims": 3, "embed": HashEmbeddings(3), "fields": ["text"]}
_MINUTE = 60_000_000


def _other(mode: str) -> str:
    return "manifest" if mode == "dynamodb" else "dynamodb"


def _fill(store: S3Store, time: FakeTime) -> None:
    """Namespaces at three depths, an overwrite (created kept, updated moved), a TTL item,
    one expired before the export, a value over 64 KiB (incompressible), a delete."""
    store.setup()
    store.put(("users", "ann"), "pref", {"text": "likes tea"})
    time.us += 1_000
    store.put(("users", "ann", "notes"), "n1", {"text": "lives in Oslo", "n": 1})
    store.put(("users", "bob"), "big", {"text": secrets.token_urlsafe(90_000)})
    store.put(("users", "ann"), "later", {"text": "short-lived"}, ttl=30)
    store.put(("users", "ann"), "gone", {"text": "expires first"}, ttl=1)
    store.put(("users", "ann"), "deleted", {"text": "x"})
    store.delete(("users", "ann"), "deleted")
    store.put(("other",), "k", {"text": "not under users"})
    time.us += 5_000
    store.put(("users", "ann"), "pref", {"text": "likes coffee"})
    time.us += 2 * _MINUTE  # "gone" has expired


def _items(data: bytes) -> list[str]:
    """The item lines of an export (the header says when it was made)."""
    lines = data.decode().splitlines()
    assert json.loads(lines[-1]) == {"end": {"items": len(lines) - 2}}
    return lines[1:-1]


def test_export_import_into_the_other_index_mode_and_back(endpoint: str, index_mode: str) -> None:
    time = FakeTime()
    clock = ttl.Clock(time)
    source = make_store(endpoint, index_mode, "src/", clock=clock, index=INDEX)
    _fill(source, time)
    data = source.export_memory(("users",))
    lines = _items(data)
    found = [json.loads(line) for line in lines]
    assert [(tuple(i["namespace"]), i["key"]) for i in found] == [
        (("users", "ann"), "pref"),
        (("users", "ann"), "later"),
        (("users", "ann", "notes"), "n1"),
        (("users", "bob"), "big"),
    ]
    assert found[1]["ttl_minutes"] == 30 and found[1]["expires_us"] and all(i["vectors"] for i in found)

    # Into the other index mode (async), then back into the first (sync): the same items,
    # times, expiries, vectors and order, line for line.
    there = make_store(endpoint, _other(index_mode), "there/", clock=clock, index=INDEX)
    there.setup()
    report = asyncio.run(there.aimport_memory(data))
    assert report == MemoryImportReport(namespaces=3, written=4, unchanged=0, expired=0, embedded=0)
    assert _items(asyncio.run(there.aexport_memory())) == lines
    back = make_store(endpoint, index_mode, "back/", clock=clock, index=INDEX)
    assert back.import_memory(there.export_memory()).written == 4
    assert _items(back.export_memory()) == lines

    for store in (there, back):
        ann = store.get(("users", "ann"), "pref", refresh_ttl=False)
        assert ann == source.get(("users", "ann"), "pref", refresh_ttl=False)  # value, created_at, updated_at
        assert ann.created_at < ann.updated_at
        assert store.get(("users", "bob"), "big").value == source.get(("users", "bob"), "big").value
        assert store.get(("users", "ann"), "gone") is None and store.get(("other",), "k") is None
        assert store.list_namespaces() == source.list_namespaces(prefix=("users",))
        assert [(h.key, h.score) for h in store.search(("users",), query="tea")] == [
            (h.key, h.score) for h in source.search(("users",), query="tea")
        ]

    # Run again: nothing to write. The TTL went with the item: past it, gone everywhere.
    again = there.import_memory(data)
    assert (again.written, again.unchanged) == (0, 4)
    time.us += 31 * _MINUTE
    assert all(s.get(("users", "ann"), "later") is None for s in (source, there, back))
    late = make_store(endpoint, index_mode, "late/", clock=clock)
    assert late.import_memory(data) == MemoryImportReport(3, 3, 0, 1)  # expired since: not written
    for store in (source, there, back, late):
        store.close()


def test_an_import_cut_after_any_round_trip_completes_when_run_again(endpoint: str, index_mode: str) -> None:
    """Objects first, index last, and an item already there left alone: an import cut after
    each of its round trips, run again by a new process, leaves every item once, whole."""
    with make_store(endpoint, _other(index_mode), "src/") as source:
        source.setup()
        source.put(("a",), "k1", {"text": "one"})
        source.put(("a", "b"), "big", {"text": secrets.token_urlsafe(80_000)})
        source.put(("c",), "k2", {"text": "two"}, ttl=60)
        data = source.export_memory()
    with make_store(endpoint, index_mode, "probe/") as probe:
        probe.setup()
        probe.stats.reset()
        probe.import_memory(data)
        waves = probe.stats.round_trips
    assert waves >= 3
    expected = _items(data)
    for k in range(1, waves):
        prefix = f"cut{k}/"
        with make_store(endpoint, index_mode, prefix) as store:
            _cut_after(store, k)
            with pytest.raises(_Cut):
                store.import_memory(data)
        with make_store(endpoint, index_mode, prefix) as store:
            report = store.import_memory(data)
            assert report.written + report.unchanged == 3 and report.written >= 1, k
            assert _items(store.export_memory()) == expected, k
            assert store.list_namespaces() == [("a",), ("a", "b"), ("c",)]


def test_vectors_are_carried_for_the_same_index_and_computed_for_another(endpoint: str) -> None:
    with make_store(endpoint, "manifest", "src/", index=INDEX) as source:
        source.setup()
        source.put(("u",), "a", {"text": "tea"})
        source.put(("u",), "b", {"text": "coffee"}, index=False)  # no vectors, and none after a carry
        data = source.export_memory()
    with make_store(endpoint, "manifest", "plain/") as plain:  # no index: carried as they are
        assert plain.import_memory(data).embedded == 0
        assert _items(plain.export_memory())[0] == _items(data)[0]
    with make_store(endpoint, "manifest", "f32/", index=INDEX, vector_dtype="float32") as f32:
        f32.import_memory(data)
        assert [h.key for h in f32.search(("u",), query="tea")][:1] == ["a"]
    with make_store(endpoint, "manifest", "other/", index=OTHER) as other:
        report = other.import_memory(data)
        assert report.embedded == 2  # this store's fields: both items hold a text
        hits = other.search(("u",), query="tea")
        assert hits[0].key == "a" and hits[0].score == pytest.approx(1.0)


# -- bad files: named, nothing written --------------------------------------------------------


def _offline() -> S3Store:
    """A store no request can reach: a refused file sends nothing."""
    return S3Store("nowhere", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")


def _good() -> bytes:
    item = {
        "namespace": ["u"], "key": "k", "created_us": 1, "updated_us": 2, "expires_us": None, "ttl_minutes": None,
        "type": "json", "value": "eyJhIjogMX0=", "vectors": None,
    }
    header = {"format": "s3_saver.memory-export/1", "prefix": [], "exported_at": "2026-01-01T00:00:00+00:00", "index": None}
    return "\n".join(json.dumps(d) for d in (header, item, {"end": {"items": 1}})).encode() + b"\n"


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda d: b"s3_saver.archive/2 zstd\n\x00\x01", "not a memory export"),
        (lambda d: d.replace(b"memory-export/1", b"memory-export/9"), "'s3_saver.memory-export/9'"),
        (lambda d: b"\n".join(d.split(b"\n")[:2]) + b"\n", "cut short: no end line after line 2 (1 items read)"),
        (lambda d: d.replace(b'{"end": {"items": 1}}', b'{"end": {"items": 2}}'), "line 3: the end line counts 2"),
        (lambda d: d.replace(b'["u"]', b'["u.v"]'), "line 2: Invalid namespace label 'u.v'"),
        (lambda d: d.replace(b'"created_us": 1', b'"created_us": 3'), "line 2: key 'k': created_us and updated_us"),
        (lambda d: d.replace(b"eyJhIjogMX0=", b"not base64!"), "line 2: key 'k': value is not base64"),
        (lambda d: d.replace(b'"ttl_minutes": null', b'"ttl": null'), "line 2: not an item line (missing ['ttl_minutes']"),
        (lambda d: d.replace(b"\n{\"end", b"\n" + d.split(b"\n")[1] + b"\n{\"end"), "line 3: key 'k' of namespace"),
        (lambda d: d + b"{}\n", "line 4: a line after the end line"),
        (lambda d: d.replace(b'"type": "json"', b'"type": "pickle2"'), "namespace ('u',), key 'k': the store's serializer"),
        # Times and ttls past what every index holds (a 64-bit microsecond count, a datetime).
        (lambda d: d.replace(b'"updated_us": 2', b'"updated_us": 18446744073709551616'), "line 2: key 'k': created_us and updated_us"),
        (lambda d: d.replace(b'"expires_us": null', b'"expires_us": 9223372036854775808'), "line 2: key 'k': expires_us is not"),
        (lambda d: d.replace(b'"ttl_minutes": null', b'"ttl_minutes": 1e300'), "line 2: key 'k': ttl_minutes is not"),
    ],
    ids=[
        "archive", "version", "cut", "count", "label", "times", "base64", "field", "twice", "after-end", "serde",
        "far-updated", "far-expiry", "far-ttl",
    ],
)
def test_a_bad_file_is_named_and_writes_nothing(change: Any, named: str) -> None:
    assert len(decode_export(_good(), "good").items) == 1
    store = _offline()
    with pytest.raises((CorruptObjectError, SerializationError)) as raised:
        store.import_memory(change(_good()))
    assert named in str(raised.value) and "the memory export given to import_memory" in str(raised.value)
    assert store.stats.round_trips == 0


def test_a_file_of_another_serializer_is_refused_before_any_write(endpoint: str) -> None:
    sealed = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 32)
    with make_store(endpoint, "manifest", "sealed/", serde=sealed) as source:
        source.setup()
        source.put(("u",), "k", {"text": "secret"})
        data = source.export_memory()
    assert b"secret" not in data  # the file holds the serializer's bytes: encrypted
    with make_store(endpoint, "manifest", "plain/") as plain:
        with pytest.raises(SerializationError, match="msgpack\\+aes"):
            plain.import_memory(data)
        assert plain.stats.round_trips == 0
    with make_store(endpoint, "manifest", "keyed/", serde=sealed) as keyed:
        keyed.import_memory(data)
        assert keyed.get(("u",), "k").value == {"text": "secret"}
