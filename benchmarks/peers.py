"""The published peers the benchmark measures S3Saver against.

One entry per saver key (``child.py --saver``): the PyPI package (the Makefile
pins its version), the module the runner imports to probe it, the class the
label names, which virtualenv it runs in, and the modes it runs. Pure standard
library: imported by the runner, the report and every child venv alike.

- ``peer``, ``peer-gzip``: langgraph-checkpoint-aws (DynamoDBSaver, S3 offload
  over 350 KB), with its defaults and with ``enable_checkpoint_compression``.
- ``peer-ddb``: langgraph-checkpoint-dynamodb, two tables, sync only (no async methods).
- ``peer-s3``: langgraph-checkpoint-s3 (S3CheckpointSaver; AsyncS3CheckpointSaver
  in async mode, built inside the running loop as it requires).
- ``peer-ddb-amazon``: langgraph-checkpoint-amazon-dynamodb (DynamoDBSaver, one
  table; imports as ``langgraph_checkpoint_dynamodb`` too, hence not in the venv
  of the package above).
- ``peer-objstore``: langgraph-checkpoint-objectstorage with its ``s3`` extra
  (ObjectStorageSaver on an s3fs filesystem).

``venv``: ``peer`` is benchmarks/.venv-peer (boto3 >= 1.43.64, which the aws
package needs), ``peer-aio`` is benchmarks/.venv-peer-aio (aioboto3 /
aiobotocore pin boto3 1.40.x, which the aws package refuses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Peer:
    package: str  # on PyPI; the Makefile pins the version
    module: str  # imported to probe the venv
    saver: str  # the class(es), for the label
    short: str  # table column name
    venv: str  # "peer" or "peer-aio" (see the module docstring)
    modes: tuple[str, ...] | None = None  # None: every mode the run asks for
    first_mode_only: bool = False  # only the run's first mode (time budget)
    options: str = ""  # how it is configured, for the label


PEERS: dict[str, Peer] = {
    "peer": Peer("langgraph-checkpoint-aws", "langgraph_checkpoint_aws", "DynamoDBSaver+S3", "peer", "peer"),
    "peer-gzip": Peer("langgraph-checkpoint-aws", "langgraph_checkpoint_aws", "DynamoDBSaver+S3", "peer+gzip", "peer",
                      first_mode_only=True, options="enable_checkpoint_compression=True"),
    "peer-s3": Peer("langgraph-checkpoint-s3", "langgraph_checkpoint_s3",
                    "S3CheckpointSaver/AsyncS3CheckpointSaver", "peer-s3", "peer-aio"),
    "peer-ddb-amazon": Peer("langgraph-checkpoint-amazon-dynamodb", "langgraph_checkpoint_dynamodb", "DynamoDBSaver",
                            "peer-ddb-amazon", "peer-aio"),
    "peer-objstore": Peer("langgraph-checkpoint-objectstorage", "langgraph_checkpoint_objectstorage",
                          "ObjectStorageSaver on s3fs", "peer-objstore", "peer-aio"),
    "peer-ddb": Peer("langgraph-checkpoint-dynamodb", "langgraph_checkpoint_dynamodb", "DynamoDBSaver",
                               "peer-ddb", "peer", modes=("sync",)),
}


def is_peer(key: str) -> bool:
    return key in PEERS


def label(key: str, version: str | None) -> str:
    p = PEERS[key]
    text = f"{p.saver} ({p.package} {version})" if version else f"{p.saver} ({p.package})"
    return f"{text}, {p.options}" if p.options else text


def run_modes(key: str, modes: list[str]) -> list[str]:
    p = PEERS[key]
    if p.first_mode_only:
        return modes[:1]
    return [m for m in modes if p.modes is None or m in p.modes]


def correct(run: dict[str, Any] | None) -> bool:
    """A workload run that finished every phase with results equal to InMemorySaver's."""
    if not (run and run.get("ok")) or run.get("workload_error"):
        return False
    ver = run.get("verification")
    return ver is not None and not any(ver.values())
