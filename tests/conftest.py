"""Shared fixtures: one moto server (real HTTP on 127.0.0.1) per session, reset per test."""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator

import pytest

# Fake credentials: the tests only ever talk to 127.0.0.1.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[_name] = _value
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_DYNAMODB"):
    os.environ.pop(_name, None)

# moto's HTTP server logs every request.
logging.getLogger("werkzeug").setLevel(logging.WARNING)

BUCKET = "checkpoints"
TABLE = "checkpoints-index"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def endpoint(moto_endpoint: str) -> str:
    """The moto endpoint, emptied before the test."""
    request = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(request).close()
    return moto_endpoint


def make_saver(endpoint: str, **kwargs):
    from s3_saver import S3Saver

    return S3Saver(BUCKET, table=TABLE, endpoint_url=endpoint, region_name="us-east-1", **kwargs)


@pytest.fixture
def saver(endpoint: str):
    s = make_saver(endpoint)
    s.setup()
    s.stats.reset()
    yield s
    s.close()
