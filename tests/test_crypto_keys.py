"""Encryption's parts on their own (``s3_saver/_crypto``): the sealed format and the place it
is bound to, the sealer's refusals, the key store and both keyrings against moto's server
(S3 and KMS over real HTTP), run by both drivers.

moto's KMS binds a wrapped key to its encryption context as real KMS does (the context is
the AES-GCM associated data of its ciphertext): ``Decrypt`` with another context answers
``InvalidCiphertextException``, ``Decrypt`` naming another key than the one that wrapped it
answers ``AccessDeniedException``, and an unknown key id or alias answers
``NotFoundException``. (Its serialization of the context concatenates keys and values
without separators; the saver's context keys are fixed names, so no two of its contexts
meet there.)
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import zlib

import boto3
import ormsgpack
import pytest

from s3_saver import (
    ConfigurationError,
    EncryptedObjectError,
    EncryptionKeyError,
    ForeignCiphertextError,
    KmsKey,
    LocalKey,
    PlaintextObjectError,
    ThreadErasedError,
    UnreadableAnswerError,
)
from s3_saver._crypto.config import LOCAL_KEY_ENV, key_bucket_of
from s3_saver._crypto.envelope import (
    MALFORMED,
    OTHER_KEY,
    OVERHEAD,
    TAG,
    DataKey,
    EnvelopeError,
    is_sealed,
    new_key_id,
    new_secret,
    open_sealed,
    place,
    seal,
)
from s3_saver._crypto.keys import Crypt
from s3_saver._crypto.records import decode_record
from s3_saver._crypto.sealer import PLAIN, SEALED_TAG, StaleKey
from s3_saver._transport.aio import AsyncDriver
from s3_saver._transport.answers import confirm
from s3_saver._transport.budget import CacheBudget
from s3_saver._transport.clients import Clients, client_config
from s3_saver._transport.protocol import Call, RequestStats
from s3_saver._transport.retry import RetryPolicy
from s3_saver._transport.sync import SyncDriver
from s3_saver.errors import Where

BUCKET = "data"
PREFIX = "app/"


# -- the sealed format, no request ----------------------------------------------------------
def _key() -> DataKey:
    return DataKey(new_key_id(), new_secret())


def test_a_sealed_string_opens_only_in_its_place_and_under_its_key() -> None:
    key = _key()
    here = place(PREFIX, "app/live/t/-/checkpoints/1", "t")
    data = b"\x82\xa6format\xa1x\xa1y\x01"
    sealed = seal(key, here, data)
    assert len(sealed) == len(data) + OVERHEAD and is_sealed(sealed)
    assert open_sealed(key, here, sealed) == data
    assert seal(key, here, data) != sealed  # a new nonce each time
    # Another key of the same thread, another thread, another prefix, a field: the tag fails.
    for there in (
        place(PREFIX, "app/live/t/-/checkpoints/2", "t"),
        place(PREFIX, "app/live/t/-/checkpoints/1", "u"),
        place("", "app/live/t/-/checkpoints/1", "t"),
        place(PREFIX, "app/live/t/-/checkpoints/1", "t", "meta"),
    ):
        with pytest.raises(EnvelopeError) as found:
            open_sealed(key, there, sealed)
        assert found.value.reason == TAG
    changed = bytearray(sealed)
    changed[-20] ^= 1
    with pytest.raises(EnvelopeError) as found:
        open_sealed(key, here, bytes(changed))
    assert found.value.reason == TAG
    with pytest.raises(EnvelopeError) as found:
        open_sealed(_key(), here, sealed)
    assert found.value.reason == OTHER_KEY
    for broken in (sealed[:20], sealed[:4] + b"\x09" + sealed[5:], data):
        with pytest.raises(EnvelopeError) as found:
            open_sealed(key, here, broken)
        assert found.value.reason == MALFORMED


def test_a_reader_tells_sealed_msgpack_and_zlib_apart_by_the_first_byte() -> None:
    record = ormsgpack.packb({"format": "s3_saver.checkpoint/1", "x": "y" * 2000})
    assert not is_sealed(record) and not is_sealed(zlib.compress(record)) and not is_sealed(b"")
    assert is_sealed(seal(_key(), place("", "k", "t"), record))


def test_a_data_key_never_shows_its_secret() -> None:
    secret = new_secret()
    key = DataKey(new_key_id(), secret)
    assert secret.hex() not in repr(key) and key.key_id.hex() in repr(key)
    local = LocalKey(secret)
    assert secret.hex() not in repr(local) and base64.b64encode(secret).decode() not in repr(local)


def test_settings_are_checked_when_made(monkeypatch) -> None:
    monkeypatch.delenv(LOCAL_KEY_ENV, raising=False)
    with pytest.raises(ConfigurationError, match=LOCAL_KEY_ENV):
        LocalKey()
    with pytest.raises(ConfigurationError, match="32 bytes"):
        LocalKey(b"short")
    with pytest.raises(ConfigurationError, match="base64"):
        LocalKey("not base64!")
    secret = os.urandom(32)
    monkeypatch.setenv(LOCAL_KEY_ENV, base64.b64encode(secret).decode())
    assert LocalKey() == LocalKey(secret) and LocalKey().fingerprint != LocalKey(os.urandom(32)).fingerprint
    with pytest.raises(ConfigurationError, match="key_bucket"):
        LocalKey(secret, key_bucket="s3://x")
    with pytest.raises(ConfigurationError, match="KMS key"):
        KmsKey("")
    assert KmsKey("arn:aws:kms:eu-west-1:123456789012:key/abc").region_name == "eu-west-1"
    assert key_bucket_of(KmsKey("alias/x"), "data") == "data-keys"
    assert key_bucket_of(KmsKey("alias/x", key_bucket="mine"), "data") == "mine"


# -- against moto: the key store and the keyrings, both drivers ---------------------------------
class Env:
    """One process's encryption (its own cache) on the shared moto server, with both drivers."""

    def __init__(self, endpoint: str, encryption) -> None:
        where = Where(BUCKET, None)
        self.clients = Clients(
            where=where,
            region_name="us-east-1",
            endpoints={"s3": endpoint, "dynamodb": endpoint, "kms": endpoint},
            config=client_config(None, max_concurrency=4, path_style=True),
            boto3_session=None,
            given={},
            aioboto3_session=None,
        )
        self.stats = RequestStats()
        self.budget = CacheBudget()
        self.crypt = Crypt(encryption, BUCKET, PREFIX, key_bucket_of(encryption, BUCKET), where, self.budget)
        self.sync = SyncDriver(lambda service, site: self.clients.make_sync(service), self.stats, 4, RetryPolicy())
        self.aio = AsyncDriver(lambda service, site: self.clients.make_async(service), self.stats, RetryPolicy())

    def run(self, op, driver: str):
        if driver == "sync":
            return self.sync.run(op)

        async def go():
            try:
                return await self.aio.run(op)
            finally:
                await self.aio.aclose()

        return asyncio.run(go())

    def load(self, threads, driver: str = "sync", create: bool = False):
        keys = self.run(self.crypt.load(threads, create=create), driver)
        return self.crypt.sealer(keys)

    def close(self) -> None:
        self.sync.close(keep=[])


def _kms_key(endpoint: str, alias: str = "alias/checkpoints") -> str:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name="us-east-1")
    key_id = kms.create_key(Description="s3_saver tests")["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=alias, TargetKeyId=key_id)
    return key_id


@pytest.fixture(params=["kms", "local"])
def encryption(request, endpoint):
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=f"{BUCKET}-keys")
    if request.param == "kms":
        _kms_key(endpoint)
        return KmsKey("alias/checkpoints")
    return LocalKey(os.urandom(32))


@pytest.fixture
def env(endpoint, encryption):
    made = []

    def make():
        made.append(Env(endpoint, encryption))
        return made[-1]

    yield make
    for e in made:
        e.close()


def _record(endpoint: str, thread: str):
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    key = f"{PREFIX}t/{thread}"
    found = s3.get_object(Bucket=f"{BUCKET}-keys", Key=key)
    return decode_record(found["Body"].read(), found["ETag"], key)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_thread_key_is_made_once_and_opens_in_another_process(env, endpoint, encryption, driver) -> None:
    writer, reader = env(), env()
    key = f"{PREFIX}live/t/-/checkpoints/1"
    sealer = writer.load(["t"], driver, create=True)
    sealed = sealer.seal("t", key, b"state")
    record = _record(endpoint, "t")
    assert record.live and record.key_id == sealer.keys["t"].key.key_id
    assert record.wrapped is not None and len(record.wrapped) > 32  # wrapped, with its own overhead
    assert ("kms:" if isinstance(encryption, KmsKey) else "local:") in record.kek
    assert reader.load(["t"], driver).open("t", key, sealed) == b"state"
    # Cached from now on: no request.
    reader.stats.reset()
    assert reader.load(["t"], driver).open("t", key, sealed) == b"state"
    assert reader.stats.total_requests == 0


def test_round_trips_of_a_cold_key_and_of_a_new_one(env, encryption) -> None:
    kms = isinstance(encryption, KmsKey)
    first = env()
    first.load(["old"], create=True)
    # A new thread: the GET (404), GenerateDataKey (KMS only), the conditional PUT.
    first.stats.reset()
    first.load(["new"], create=True)
    assert first.stats.round_trips == (3 if kms else 2)
    # A thread a read saw without a key (LangGraph reads before its first put): no GET again.
    first.load(["newer"])
    first.stats.reset()
    first.load(["newer"], create=True)
    assert first.stats.round_trips == (2 if kms else 1)
    # A cold process: the GET, and KMS's Decrypt; both threads in the same waves.
    cold = env()
    cold.load(["old", "new"])
    assert cold.stats.round_trips == (2 if kms else 1)
    assert cold.stats.requests[("s3", "get_object")] == 2
    assert cold.stats.requests[("kms", "decrypt")] == (2 if kms else 0)
    assert cold.budget.stats().caches["keys"].entries == 2 and cold.budget.stats().caches["keys"].bytes > 0


def test_concurrent_first_writes_agree_on_one_key(env, endpoint) -> None:
    a, b = env(), env()
    # Both saw the thread without a key; both make one: the conditional create decides.
    a.load(["t"])
    b.load(["t"])
    key_a = a.load(["t"], create=True).keys["t"].key.key_id
    key_b = b.load(["t"], create=True).keys["t"].key.key_id
    assert key_a == key_b == _record(endpoint, "t").key_id
    # And from threads at once, in fresh processes: one key for all.
    got: list[bytes] = []
    envs = [env() for _ in range(4)]

    def write(e: Env) -> None:
        got.append(e.load(["u"], create=True).keys["u"].key.key_id)

    workers = [threading.Thread(target=write, args=(e,)) for e in envs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(got) == 4 and set(got) == {_record(endpoint, "u").key_id}


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_destroyed_key_makes_every_copy_read_as_erased(env, endpoint, driver) -> None:
    writer = env()
    key = f"{PREFIX}live/t/-/checkpoints/1"
    sealed = writer.load(["t"], driver, create=True).seal("t", key, b"state")
    erased = writer.run(writer.crypt.store.destroy("t", 1_700_000_000), driver)
    assert erased is not None and not erased.live and erased.wrapped is None
    record = _record(endpoint, "t")
    assert not record.live and record.wrapped is None and record.erased_at == 1_700_000_000
    # Destroyed again: the same erasure, nothing changes.
    assert writer.run(writer.crypt.store.destroy("t", 1_800_000_000), driver).erased_at == 1_700_000_000
    with pytest.raises(ThreadErasedError) as found:
        env().load(["t"], driver).open("t", key, sealed)
    assert found.value.erased_at == 1_700_000_000 and found.value.thread_id == "t" and found.value.key == key
    # No new life while the erase is under way (the erasure is not settled yet).
    writer.crypt.forget("t")
    with pytest.raises(ThreadErasedError, match="is being erased") as found:
        writer.load(["t"], driver, create=True)
    assert found.value.erased_at == 1_700_000_000 and found.value.thread_id == "t"
    settled = writer.run(writer.crypt.store.settle("t", record), driver)
    assert settled is not None and settled.settled and not settled.live
    assert _record(endpoint, "t").settled
    # A new life: a new key, its record naming the destroyed one; the old copy still reads erased.
    new = writer.load(["t"], driver, create=True)
    assert new.keys["t"].key.key_id != record.key_id
    assert _record(endpoint, "t").earlier == ((record.key_id, 1_700_000_000),)
    assert new.open("t", key, new.seal("t", key, b"again")) == b"again"
    with pytest.raises(ThreadErasedError):
        env().load(["t"], driver).open("t", key, sealed)


def test_foreign_plaintext_and_missing_keys_are_refused_by_name(env) -> None:
    e = env()
    sealer = e.load(["a", "b"], create=True)
    key_a, key_b = f"{PREFIX}live/a/-/checkpoints/1", f"{PREFIX}live/b/-/checkpoints/1"
    sealed = sealer.seal("a", key_a, b"a's state")
    # Copied to another key of its thread, or to another thread's key: foreign.
    with pytest.raises(ForeignCiphertextError) as found:
        sealer.open("a", f"{PREFIX}live/a/-/checkpoints/2", sealed)
    assert found.value.bucket == BUCKET and found.value.thread_id == "a"
    with pytest.raises(ForeignCiphertextError):
        sealer.open("b", key_b, sealed)
    with pytest.raises(PlaintextObjectError) as plain:
        sealer.open("a", key_a, ormsgpack.packb({"format": "s3_saver.checkpoint/1"}))
    assert plain.value.key == key_a and plain.value.thread_id == "a" and f"s3://{BUCKET}/{key_a}" in str(plain.value)
    # The metadata an index entry carries: sealed under its own field of the object's place.
    pair = sealer.seal_meta("a", key_a, ("msgpack", b"\x80"))
    assert pair[0] == SEALED_TAG and sealer.open_meta("a", key_a, pair, "item") == ("msgpack", b"\x80")
    with pytest.raises(ForeignCiphertextError):
        sealer.open("a", key_a, pair[1])
    with pytest.raises(PlaintextObjectError):
        sealer.open_meta("a", key_a, ("msgpack", b"\x80"), "item")
    # A saver without encryption meets sealed bytes: it says so.
    with pytest.raises(EncryptedObjectError, match="encryption="):
        PLAIN.open("a", key_a, sealed)
    with pytest.raises(EncryptedObjectError):
        PLAIN.open_meta("a", key_a, pair, "item")
    # A thread with no key at all (another key store, a record removed by hand): not
    # decided on one read of the record, as a migration may have made the key since;
    # read again and still keyless, the read answers ``instead`` (test_encryption).
    with pytest.raises(StaleKey) as keyless:
        env().load(["c"]).open("c", f"{PREFIX}live/c/-/checkpoints/1", sealed)
    assert isinstance(keyless.value.instead, ThreadErasedError) and "key store" in str(keyless.value.instead)
    # A put sent again by another process meets the object sealed with another nonce: the same.
    same = sealer.same("a")
    assert same(key_a, sealed, sealer.seal("a", key_a, b"a's state"))
    assert not same(key_a, sealed, sealer.seal("a", key_a, b"other"))


def test_a_key_record_moved_to_another_thread_does_not_unwrap(env, endpoint) -> None:
    env().load(["a"], create=True)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.copy_object(Bucket=f"{BUCKET}-keys", Key=f"{PREFIX}t/b", CopySource={"Bucket": f"{BUCKET}-keys", "Key": f"{PREFIX}t/a"})
    with pytest.raises(ForeignCiphertextError) as found:
        env().load(["b"])
    assert found.value.key == f"{PREFIX}t/b" and found.value.bucket == f"{BUCKET}-keys"


def test_a_record_wrapped_by_another_key_is_named(endpoint) -> None:
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=f"{BUCKET}-keys")
    first = Env(endpoint, LocalKey(os.urandom(32)))
    first.load(["t"], create=True)
    with pytest.raises(EncryptionKeyError, match="local master key"):
        Env(endpoint, LocalKey(os.urandom(32))).load(["t"])
    _kms_key(endpoint)
    with pytest.raises(EncryptionKeyError, match="local:"):
        Env(endpoint, KmsKey("alias/checkpoints")).load(["t"])
    # A KMS key that does not exist: named, not a bare ClientError.
    with pytest.raises(EncryptionKeyError, match="alias/missing"):
        Env(endpoint, KmsKey("alias/missing")).load(["u"], create=True)


def test_a_kms_answer_without_its_data_key_is_not_taken() -> None:
    where = Where(BUCKET, None)
    for operation, answer in (
        ("generate_data_key", {"KeyId": "k", "CiphertextBlob": b"x"}),
        ("decrypt", {"KeyId": "k"}),
    ):
        found = confirm(Call("kms", operation, {"KeyId": "k"}, where), answer)
        assert isinstance(found, UnreadableAnswerError) and "KMS" in str(found) and "Plaintext" in str(found)
    good = {"KeyId": "k", "Plaintext": b"p" * 32}
    assert confirm(Call("kms", "decrypt", {"KeyId": "k"}, where), good) is good


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_kms_rewraps_a_data_key_under_another_key_without_changing_it(endpoint, driver) -> None:
    """ReEncrypt (rotation's building block): the same data key, wrapped under the new KMS
    key and still bound to its thread; unwrapped by the key the record names."""
    from dataclasses import replace

    from s3_saver._crypto.records import context

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=f"{BUCKET}-keys")
    _kms_key(endpoint)
    new_key = _kms_key(endpoint, "alias/rotated")
    e = Env(endpoint, KmsKey("alias/checkpoints"))
    key = f"{PREFIX}live/t/-/checkpoints/1"
    sealed = e.load(["t"], driver, create=True).seal("t", key, b"state")
    record = e.run(e.crypt.store.read_one("t"), driver)
    item = e.crypt._sealed("t", record)
    ((wrapped, kek),) = e.run(e.crypt.keyring.rewrap([item], "alias/rotated"), driver)
    assert wrapped != record.wrapped and kek.startswith("kms:") and new_key in kek
    rotated = replace(record, wrapped=wrapped, kek=kek)
    (secret,) = e.run(e.crypt.keyring.unwrap([replace(item, record=rotated)]), driver)
    assert open_sealed(DataKey(record.key_id, secret), place(PREFIX, key, "t"), sealed) == b"state"
    # Bound to its thread still: the rotated key does not unwrap for another one.
    other = replace(item, record=rotated, context=context(PREFIX, "u", record.key_id), thread_id="u")
    with pytest.raises(ForeignCiphertextError):
        e.run(e.crypt.keyring.unwrap([other]), driver)
    e.close()
