"""What a new user meets when building a saver: names checked at once, a repr that says
which store it is, the region from AWS_REGION, and async clients that close themselves."""

from __future__ import annotations

import asyncio
import builtins
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BUCKET, TABLE
from helpers import checkpoint, config, no_unclosed_sessions
from s3_saver import ConfigurationError, Replica, S3Saver


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"bucket": "s3://checkpoints"}, "bucket='s3://checkpoints'"),
        ({"bucket": "check points"}, "bucket='check points'"),
        ({"bucket": "checkpoints/agent"}, "prefix="),
        ({"bucket": "ab"}, "bucket='ab'"),
        ({"bucket": "a..b"}, "bucket='a..b'"),
        ({"bucket": "checkpoints", "table": "bad table!"}, "table='bad table!'"),
        ({"bucket": "checkpoints", "table": "ab"}, "table='ab'"),
    ],
)
def test_names_that_never_name_a_bucket_or_table_are_refused_at_construction(kwargs, named) -> None:
    with pytest.raises(ConfigurationError) as caught:
        S3Saver(**kwargs)
    assert named in str(caught.value)


def test_a_replicas_names_are_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="Replica.bucket='s3://replica'"):
        Replica(bucket="s3://replica")
    with pytest.raises(ConfigurationError, match="Replica.table='no spaces please'"):
        Replica(bucket="replica", table="no spaces please")


def test_legacy_us_east_1_bucket_names_still_work() -> None:
    # Buckets named before 2018 in us-east-1 may hold capitals and underscores; their
    # threads must stay reachable.
    assert S3Saver("Legacy_Bucket", table="t_1").bucket == "Legacy_Bucket"


def test_repr_names_the_store_and_never_a_secret() -> None:
    dynamo = S3Saver("checkpoints", table="index", prefix="agents/", region_name="eu-west-1")
    assert repr(dynamo) == "S3Saver('checkpoints', table='index', prefix='agents/', region='eu-west-1')"
    manifest = S3Saver("checkpoints", region_name="eu-west-1", replica=Replica(bucket="checkpoints-dr", region_name="eu-central-1"))
    assert repr(manifest) == "S3Saver('checkpoints', index='manifest', prefix='', region='eu-west-1', replica='checkpoints-dr')"


def test_the_region_comes_from_aws_region_alone(endpoint: str, index_mode: str, monkeypatch) -> None:
    # The quick start sets AWS_REGION, as the AWS CLI and the other SDKs read it; boto3
    # alone reads only AWS_DEFAULT_REGION and would raise NoRegionError.
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    saver = S3Saver(BUCKET, table=TABLE if index_mode == "dynamodb" else None, endpoint_url=endpoint)
    saver.setup()
    stored = saver.put(config("t"), checkpoint({"a": 1}, {"a": "1"}), {"source": "input", "step": -1}, {"a": "1"})
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"a": 1}
    assert "region='us-east-1'" in repr(saver)

    async def read() -> dict:
        try:
            return (await saver.aget_tuple(stored)).checkpoint["channel_values"]
        finally:
            await saver.aclose()

    assert asyncio.run(read()) == {"a": 1}


def test_the_missing_aioboto3_error_names_this_package(monkeypatch) -> None:
    saver = S3Saver("checkpoints", table="index", region_name="us-east-1")
    real_import = builtins.__import__

    def no_aioboto3(name, *args, **kwargs):
        if name == "aioboto3":
            raise ImportError("No module named 'aioboto3'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "aioboto3", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_aioboto3)
    with pytest.raises(ImportError) as caught:
        asyncio.run(saver.aget_tuple(config("t")))
    # The package is not on the package index (and 's3-saver' there is an unrelated
    # package): the command that works is the checkout's.
    assert "pip install '.[async]' in a checkout" in str(caught.value)
    assert "langgraph-s3-saver[" not in str(caught.value) and "s3-saver" not in str(caught.value)


def test_an_async_handler_per_invocation_leaves_no_unclosed_session(saver, capfd) -> None:
    # An async Lambda handler: one asyncio.run per invocation, and no aclose() called.
    async def invocation(n: int) -> None:
        stored = await saver.aput(config(f"t{n}"), checkpoint({"n": n}, {"n": "1"}), {"source": "input", "step": -1}, {"n": "1"})
        assert (await saver.aget_tuple(stored)).checkpoint["channel_values"] == {"n": n}

    with no_unclosed_sessions(capfd):
        for n in range(3):
            asyncio.run(invocation(n))
    assert not saver._async._loops  # each loop's clients closed as it shut down
    # A user who closes them anyway is not hurt by it.
    async def closing() -> None:
        await invocation(9)
        await saver.aclose()

    with no_unclosed_sessions(capfd):
        asyncio.run(closing())


def test_the_demo_runs_clean_and_prints_what_the_readme_promises() -> None:
    # `make demo` is the first thing a new user runs: no traceback (moto's own races
    # printed some), and the README's "two round trips" for a cold read is what it prints.
    demo = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
    result = subprocess.run([sys.executable, str(demo)], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    cold = re.search(r"cost of reading the state in a cold process: (\d+) round trips, (\d+) requests, \$(\d\.\d+)", output)
    assert cold is not None and int(cold.group(1)) == 2 and float(cold.group(3)) > 0, output
    assert "Thread deleted. Done." in output
