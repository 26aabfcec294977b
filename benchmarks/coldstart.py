"""Cold start: a fresh interpreter imports a saver and commits its first checkpoint.

    python benchmarks/coldstart.py SAVER ENDPOINT BUCKET TABLE

Run as a script (not ``-m``) so nothing else is imported first. Prints one JSON
line: seconds spent importing, constructing, and in the first ``put``, with the
monotonic interval of the ``put`` so the parent can count its requests.
``SAVER=boto3`` imports boto3 alone (the floor every AWS saver pays).
"""

import json
import os
import sys
import time

T0 = time.monotonic()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _guard  # noqa: E402  (stdlib only)

_guard.install()


def main() -> None:
    saver_kind, endpoint, bucket, table = sys.argv[1:5]
    out = {}
    t = time.monotonic()
    if saver_kind == "boto3":
        import boto3  # noqa: F401

        out["import"] = time.monotonic() - t
        print(json.dumps(out))
        return
    if saver_kind == "s3":
        from s3_saver import S3Saver

        out["import"] = time.monotonic() - t
        t = time.monotonic()
        saver = S3Saver(bucket, table=table, endpoint_url=endpoint, region_name="us-east-1")
    elif saver_kind == "s3-manifest":
        from s3_saver import S3Saver

        out["import"] = time.monotonic() - t
        t = time.monotonic()
        saver = S3Saver(bucket, endpoint_url=endpoint, region_name="us-east-1")  # no table: manifest index
    elif saver_kind == "peer":
        from langgraph_checkpoint_aws import DynamoDBSaver

        out["import"] = time.monotonic() - t
        t = time.monotonic()
        saver = DynamoDBSaver(table_name=table, region_name="us-east-1", endpoint_url=endpoint,
                              s3_offload_config={"bucket_name": bucket, "endpoint_url": endpoint})
    elif saver_kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        out["import"] = time.monotonic() - t
        t = time.monotonic()
        saver = InMemorySaver()
    else:
        raise SystemExit(f"unknown saver {saver_kind}")
    out["construct"] = time.monotonic() - t
    from langgraph.checkpoint.base import empty_checkpoint

    ckpt = empty_checkpoint()
    ckpt["channel_values"] = {"messages": ["hello"], "counter": 1}
    ckpt["channel_versions"] = {"messages": saver.get_next_version(None, None),
                                "counter": saver.get_next_version(None, None)}
    config = {"configurable": {"thread_id": f"cold-{os.getpid()}", "checkpoint_ns": ""}}
    t = time.monotonic()
    saver.put(config, ckpt, {"source": "input", "step": -1, "parents": {}}, dict(ckpt["channel_versions"]))
    out["first_put"] = time.monotonic() - t
    out["put_interval"] = [t, time.monotonic()]
    out["total_in_process"] = time.monotonic() - T0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
