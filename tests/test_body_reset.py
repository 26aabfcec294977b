"""A connection dropped while a GetObject body is read (issue 22, item 6): the body read
is retried like the request, and when every attempt fails the caller gets the saver's
``StoreUnavailableError``, never a raw ``urllib3``/``aiohttp`` exception, in both
drivers and both index modes."""

from __future__ import annotations

import asyncio

import pytest
from botocore.config import Config

from conftest import make_saver
from faults import FaultProxy
from helpers import checkpoint, grow_thread
from s3_saver import S3SaverError, StoreUnavailableError

BIG = "x" * 300_000  # above the inline threshold: the value is an object of its own, read by a GET


def _get_object(req) -> bool:
    return req.service == "s3" and req.method == "GET" and "/blobs/" in req.path


def _thread(endpoint: str, mode: str) -> dict:
    writer = make_saver(endpoint, mode)
    writer.setup()
    grow_thread(writer, "t", 2)
    stored = writer.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}).config
    cp = checkpoint({"doc": BIG}, {"doc": "9"})
    writer.put(stored, cp, {}, {"doc": "9"})
    writer.close()
    return {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _read(saver, driver: str, config: dict):
    if driver == "sync":
        return saver.get_tuple(config)

    async def go():
        try:
            return await saver.aget_tuple(config)
        finally:
            await saver.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_body_cut_once_is_read_again(endpoint: str, index_mode: str, driver: str) -> None:
    config = _thread(endpoint, index_mode)
    with FaultProxy(endpoint, rate=1.0, kinds=["reset_mid_body"], operations=_get_object, max_faults=1) as proxy:
        saver = make_saver(proxy.url, index_mode, client_config=Config(read_timeout=2))
        got = _read(saver, driver, config)
        assert proxy.faults["reset_mid_body"] == 1
    assert got.checkpoint["channel_values"]["doc"] == BIG
    saver.close()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_body_cut_every_time_raises_the_saver_error(endpoint: str, index_mode: str, driver: str) -> None:
    config = _thread(endpoint, index_mode)
    with FaultProxy(endpoint, rate=1.0, kinds=["reset_mid_body"], operations=_get_object) as proxy:
        saver = make_saver(proxy.url, index_mode, client_config=Config(read_timeout=2))
        with pytest.raises(S3SaverError) as caught:
            _read(saver, driver, config)
        assert proxy.faults["reset_mid_body"] >= 2  # retried before giving up
    assert isinstance(caught.value, StoreUnavailableError), repr(caught.value)
    assert "GetObject" in str(caught.value) or "get_object" in str(caught.value), str(caught.value)
    saver.close()
