"""Helpers for the infra/ tests: load and evaluate the CloudFormation template,
find the lint tools, record the AWS calls a saver makes and map them to IAM.

Nothing here talks to AWS: the template is evaluated in Python, and the calls
are recorded from botocore's event hooks on clients pointed at moto.
"""

from __future__ import annotations

import operator
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import unquote

import pytest
import yaml
from botocore import xform_name
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "infra" / "template.yaml"
REPLICA_TEMPLATE = REPO / "infra" / "replica.yaml"
INFRA_BIN = REPO / ".venv-infra" / "bin"

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
PARTITION = "aws"


# -- loading ----------------------------------------------------------------------
class _CfnLoader(yaml.SafeLoader):
    """YAML loader that turns CloudFormation short tags (``!Ref``, ``!Sub``...) into
    their long form (``{"Ref": ...}``, ``{"Fn::Sub": ...}``)."""


def _short_tag(loader: _CfnLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "Condition":
        return {"Condition": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _short_tag)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    with path.open() as f:
        return yaml.load(f, Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass


# -- evaluating ---------------------------------------------------------------------
class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE = _NoValue()
_SUB_VAR = re.compile(r"\$\{([^}!][^}]*)\}")


class Stack:
    """The template evaluated for one set of parameter values, as CloudFormation would:
    conditions decided, intrinsic functions resolved, ``AWS::NoValue`` dropped.

    Resources' ``Ref`` and ``Fn::GetAtt`` values come from ``physical``
    (``{"Bucket": {"Ref": "name", "Arn": "arn:..."}}``); missing ones are
    placeholders such as ``"<Bucket.Arn>"``.
    """

    def __init__(
        self,
        template: dict[str, Any],
        parameters: dict[str, str] | None = None,
        physical: dict[str, dict[str, str]] | None = None,
        stack_name: str = "s3-saver",
        region: str = REGION,
    ) -> None:
        self.template = template
        declared = template.get("Parameters", {})
        unknown = set(parameters or {}) - set(declared)
        if unknown:
            raise KeyError(f"template has no parameters {sorted(unknown)}")
        self.parameters = {name: str(spec.get("Default", "")) for name, spec in declared.items()}
        self.parameters.update({k: str(v) for k, v in (parameters or {}).items()})
        missing = [name for name, spec in declared.items() if "Default" not in spec and name not in (parameters or {})]
        if missing:
            raise KeyError(f"parameters without a default need a value: {missing}")
        self.pseudo = {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": region,
            "AWS::Partition": PARTITION,
            "AWS::StackName": stack_name,
            "AWS::URLSuffix": "amazonaws.com",
        }
        self.physical = physical or {}
        self._conditions: dict[str, bool] = {}

    # conditions
    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            self._conditions[name] = bool(self.value(self.template["Conditions"][name]))
        return self._conditions[name]

    # resources and outputs
    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        """Resources whose condition holds, with resolved properties."""
        out = {}
        for name, spec in self.template["Resources"].items():
            if "Condition" in spec and not self.condition(spec["Condition"]):
                continue
            resolved = {k: v for k, v in spec.items() if k != "Properties"}
            resolved["Properties"] = self.value(spec.get("Properties", {}))
            out[name] = resolved
        return out

    def properties(self, resource: str) -> dict[str, Any]:
        return self.resources[resource]["Properties"]

    @property
    def outputs(self) -> dict[str, Any]:
        return {
            name: self.value(spec["Value"])
            for name, spec in self.template.get("Outputs", {}).items()
            if "Condition" not in spec or self.condition(spec["Condition"])
        }

    # intrinsic functions
    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self.template["Resources"]:
            return self.physical.get(name, {}).get("Ref", f"<{name}>")
        raise KeyError(f"Ref to unknown name {name!r}")

    def get_att(self, resource: str, attribute: str) -> Any:
        if resource not in self.template["Resources"]:
            raise KeyError(f"GetAtt of unknown resource {resource!r}")
        return self.physical.get(resource, {}).get(attribute, f"<{resource}.{attribute}>")

    def _sub(self, text: str, extra: dict[str, Any]) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in extra:
                return str(extra[name])
            if "." in name and name.split(".", 1)[0] in self.template["Resources"]:
                return str(self.get_att(*name.split(".", 1)))
            return str(self.ref(name))

        return _SUB_VAR.sub(one, text).replace("${!", "${")

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            items = [self.value(x) for x in node]
            return [x for x in items if x is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, arg), = node.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Condition" and isinstance(arg, str):
                return self.condition(arg)
            if key == "Fn::GetAtt":
                return self.get_att(*arg)
            if key == "Fn::Sub":
                text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self.value(arg[1]))
                return self._sub(text, extra)
            if key == "Fn::If":
                return self.value(arg[1] if self.condition(arg[0]) else arg[2])
            if key == "Fn::Equals":
                a, b = (self.value(x) for x in arg)
                return str(a) == str(b)
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(x) for x in arg)
            if key == "Fn::Or":
                return any(self.value(x) for x in arg)
            if key == "Fn::Join":
                return arg[0].join(str(x) for x in self.value(arg[1]))
            if key == "Fn::Select":
                return self.value(arg[1])[int(self.value(arg[0]))]
            if key.startswith("Fn::"):
                raise NotImplementedError(f"{key} is not evaluated by tests/infra_support.py")
        out = {k: self.value(v) for k, v in node.items()}
        return {k: v for k, v in out.items() if v is not NO_VALUE}


# -- lint tools ----------------------------------------------------------------------
def infra_tool(name: str) -> str:
    """Path of cfn-lint or checkov: the Makefile's .venv-infra first, then PATH.

    Missing tools fail the test under CI (``make test`` installs them) and skip it
    elsewhere, with the command that installs them.
    """
    candidate = INFRA_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} is not installed: run `make infra-tools` (make test does it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# -- recording calls ---------------------------------------------------------------
@dataclass
class RecordedCall:
    service: str  # botocore service name: "s3", "dynamodb"
    signing_name: str  # IAM service prefix for these services
    operation: str  # API operation name: "PutObject"
    params: dict[str, Any]
    status: int | None = None  # HTTP status of the answer (None: no answer, e.g. a connection error)

    @property
    def boto3_name(self) -> str:
        return xform_name(self.operation)


@dataclass(eq=False)  # hashable: botocore keys handlers by identity
class CallRecorder:
    """Records every API call made through the clients or sessions it is attached to.

    Uses botocore's ``before-parameter-build`` event, which every API call of a
    client emits (sync boto3 and aiobotocore alike) with the caller's parameters.
    """

    calls: list[RecordedCall] = field(default_factory=list)
    active: bool = True

    def __call__(self, params: dict[str, Any], model: Any, context: dict[str, Any] | None = None, **_: Any) -> None:
        if self.active:
            sm = model.service_model
            call = RecordedCall(sm.service_name, sm.signing_name, model.name, dict(params))
            self.calls.append(call)
            if context is not None:
                # The same dict reaches after-call: the answer's status lands on this call.
                context.setdefault("infra_support_calls", []).append(call)

    def answered(self, http_response: Any = None, context: dict[str, Any] | None = None, **_: Any) -> None:
        for call in (context or {}).get("infra_support_calls", ()):
            if http_response is not None:
                call.status = http_response.status_code

    def attach(self, events: Any) -> None:
        """``events``: ``client.meta.events``, ``boto3.Session().events`` or ``aioboto3.Session().events``."""
        events.register("before-parameter-build", self)
        events.register("after-call", self.answered)

    def operations(self) -> set[tuple[str, str]]:
        return {(c.service, c.operation) for c in self.calls}


# -- calls -> IAM ----------------------------------------------------------------------
# The IAM action of an API operation is "<service prefix>:<OperationName>" except
# where IAM authorizes the call under another name (AWS Service Authorization
# Reference, "Actions defined by Amazon S3 / DynamoDB").
IAM_ACTION_EXCEPTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("s3", "DeleteObjects"): ("s3:DeleteObject",),  # authorized per key
    ("s3", "HeadObject"): ("s3:GetObject",),
    ("s3", "HeadBucket"): ("s3:ListBucket",),
    ("s3", "ListObjects"): ("s3:ListBucket",),
    ("s3", "ListObjectsV2"): ("s3:ListBucket",),
    ("s3", "ListObjectVersions"): ("s3:ListBucketVersions",),
    ("s3", "CopyObject"): ("s3:PutObject",),  # and s3:GetObject on CopySource, see authorizations()
    ("s3", "UploadPartCopy"): ("s3:PutObject",),
    ("s3", "CreateMultipartUpload"): ("s3:PutObject",),
    ("s3", "UploadPart"): ("s3:PutObject",),
    ("s3", "CompleteMultipartUpload"): ("s3:PutObject",),
    ("s3", "AbortMultipartUpload"): ("s3:AbortMultipartUpload",),
    ("s3", "ListParts"): ("s3:ListMultipartUploadParts",),
    ("s3", "GetObjectAttributes"): ("s3:GetObject", "s3:GetObjectAttributes"),
    ("dynamodb", "TransactGetItems"): ("dynamodb:GetItem",),
}

# With SSE-KMS, S3 calls KMS on the caller's behalf and with the caller's rights.
# (Copies also decrypt their source: see authorizations().)
KMS_ACTIONS_VIA_S3: dict[str, tuple[str, ...]] = {
    "PutObject": ("kms:GenerateDataKey",),
    "CopyObject": ("kms:GenerateDataKey",),
    "UploadPartCopy": ("kms:GenerateDataKey",),
    "CreateMultipartUpload": ("kms:GenerateDataKey",),
    "UploadPart": ("kms:GenerateDataKey",),
    "CompleteMultipartUpload": ("kms:Decrypt",),
    "GetObject": ("kms:Decrypt",),
    "SelectObjectContent": ("kms:Decrypt",),
}

_TRANSACT_WRITE_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def iam_actions(call: RecordedCall) -> tuple[str, ...]:
    """IAM actions that authorize one recorded call (not counting KMS)."""
    if (call.service, call.operation) in IAM_ACTION_EXCEPTIONS:
        actions = IAM_ACTION_EXCEPTIONS[(call.service, call.operation)]
    elif call.service == "dynamodb" and call.operation == "TransactWriteItems":
        actions = tuple(
            sorted({_TRANSACT_WRITE_ACTIONS[kind] for item in call.params["TransactItems"] for kind in item})
        )
    else:
        actions = (f"{call.signing_name}:{call.operation}",)
    if call.service == "s3" and call.operation == "DeleteObjects":
        # Authorized per key; an object named with its version needs the version action.
        if any("VersionId" in o for o in call.params["Delete"]["Objects"]):
            actions = ("s3:DeleteObjectVersion",) if all("VersionId" in o for o in call.params["Delete"]["Objects"]) else ("s3:DeleteObject", "s3:DeleteObjectVersion")
    if call.service == "s3" and call.params.get("VersionId"):
        # GetObject/DeleteObject of a given version are separate actions.
        actions = tuple(a + "Version" if a in ("s3:GetObject", "s3:DeleteObject") else a for a in actions)
    return actions


def resource_arns(call: RecordedCall, region: str = REGION, account: str = ACCOUNT) -> list[str]:
    """ARNs of the resources one recorded call touches."""
    p = call.params
    if call.service == "s3":
        bucket = f"arn:{PARTITION}:s3:::{p['Bucket']}"
        if "Key" in p:
            return [f"{bucket}/{p['Key']}"]
        if "Delete" in p:
            return [f"{bucket}/{o['Key']}" for o in p["Delete"]["Objects"]]
        return [bucket]
    if call.service == "dynamodb":
        tables = []
        if "TableName" in p:
            tables.append((p["TableName"], p.get("IndexName")))
        tables += [(t, None) for t in p.get("RequestItems", {})]
        for item in p.get("TransactItems", []):
            for body in item.values():
                tables.append((body["TableName"], None))
        arns = []
        for table, index in tables:
            arn = f"arn:{PARTITION}:dynamodb:{region}:{account}:table/{table}"
            arns.append(f"{arn}/index/{index}" if index else arn)
        return arns
    raise NotImplementedError(f"no resource mapping for service {call.service!r}: extend resource_arns()")


@dataclass(frozen=True)
class Request:
    """One IAM authorization: an action on a resource, with its condition context."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()


def _copy_source(params: dict[str, Any]) -> tuple[str, str, str | None]:
    """(bucket, key, version) of a CopySource given as a dict or as "bucket/key?versionId=v"."""
    source = params["CopySource"]
    if isinstance(source, dict):
        return source["Bucket"], source["Key"], source.get("VersionId")
    path, _, query = source.lstrip("/").partition("?versionId=")
    bucket, _, key = path.partition("/")
    return bucket, unquote(key), query or None


def _kms_via_s3(action: str, bucket: str, kms_key_arn: str, region: str) -> Request:
    # With an S3 Bucket Key the encryption context is the bucket's ARN.
    context = (
        ("kms:ViaService", f"s3.{region}.amazonaws.com"),
        ("kms:EncryptionContext:aws:s3:arn", f"arn:{PARTITION}:s3:::{bucket}"),
    )
    return Request(action, kms_key_arn, context)


def authorizations(
    call: RecordedCall, *, kms_key_arn: str | None, region: str = REGION, account: str = ACCOUNT
) -> list[Request]:
    """Every authorization a recorded call needs, including KMS through S3 (SSE-KMS)."""
    if call.service == "kms":
        return _kms_requests(call, region, account)
    context: tuple[tuple[str, str], ...] = ()
    if call.service == "s3" and call.operation in ("ListObjects", "ListObjectsV2", "ListObjectVersions"):
        # A listing is authorized with the prefix it asks for (IAM's s3:prefix key;
        # absent, i.e. no StringLike matches, when it lists the whole bucket).
        context = (("s3:prefix", call.params["Prefix"]),) if "Prefix" in call.params else ()
    out = [
        Request(action, arn, context) for action in iam_actions(call) for arn in resource_arns(call, region, account)
    ]
    if call.service == "dynamodb":
        if kms_key_arn:
            # A table encrypted with a customer managed key: DynamoDB decrypts the
            # table key with the caller's rights.
            tables = {arn.split(":table/")[1].split("/")[0] for arn in resource_arns(call, region, account)}
            for table in sorted(tables):
                context = (
                    ("kms:ViaService", f"dynamodb.{region}.amazonaws.com"),
                    ("kms:EncryptionContext:aws:dynamodb:tableName", table),
                )
                out.append(Request("kms:Decrypt", kms_key_arn, context))
        return out
    if call.service != "s3":
        return out
    if kms_key_arn:
        out += [
            _kms_via_s3(action, call.params["Bucket"], kms_key_arn, region)
            for action in KMS_ACTIONS_VIA_S3.get(call.operation, ())
        ]
    if call.operation in ("GetObject", "HeadObject") and call.status == 404 and not _in_node_cache(call.params["Key"]):
        # S3 answers a GET or HEAD of a missing key with 404 only to a caller allowed
        # s3:ListBucket on the bucket, with 403 to anyone else: a saver that tells
        # "not there (yet)" from "denied" needs it (replica reads under replication lag).
        # The node cache takes a 403 for a miss as it takes a 404: it needs no s3:ListBucket.
        out.append(Request("s3:ListBucket", f"arn:{PARTITION}:s3:::{call.params['Bucket']}"))
    if "CopySource" in call.params:
        bucket, key, version = _copy_source(call.params)
        action = "s3:GetObjectVersion" if version else "s3:GetObject"
        out.append(Request(action, f"arn:{PARTITION}:s3:::{bucket}/{key}"))
        if kms_key_arn:
            out.append(_kms_via_s3("kms:Decrypt", bucket, kms_key_arn, region))
    return out


def _kms_key_arn(key_id: str, region: str, account: str) -> str:
    """A KMS KeyId parameter as the ARN IAM authorizes (an alias is resolved by KMS to
    its key, which a test names by ARN to be checked)."""
    if key_id.startswith("arn:"):
        return key_id
    return f"arn:{PARTITION}:kms:{region}:{account}:key/{key_id}"


def _kms_requests(call: RecordedCall, region: str, account: str) -> list[Request]:
    """A KMS call made by the saver itself (``encryption=KmsKey``): its action on the key
    it names, with the encryption context as IAM's ``kms:EncryptionContext:<key>``.
    ReEncrypt is two: ``kms:ReEncryptFrom`` on the source key, ``kms:ReEncryptTo`` on
    the destination."""
    p = call.params

    def context(name: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((f"kms:EncryptionContext:{k}", v) for k, v in (p.get(name) or {}).items()))

    if call.operation == "ReEncrypt":
        return [
            Request("kms:ReEncryptFrom", _kms_key_arn(p["SourceKeyId"], region, account), context("SourceEncryptionContext")),
            Request("kms:ReEncryptTo", _kms_key_arn(p["DestinationKeyId"], region, account), context("DestinationEncryptionContext")),
        ]
    return [Request(f"kms:{call.operation}", _kms_key_arn(p["KeyId"], region, account), context("EncryptionContext"))]


def _in_node_cache(key: str) -> bool:
    """Whether ``key`` is the node cache's (S3Cache). No prefix has a folder name as a
    segment, so the first segment that is one is the key's folder."""
    from s3_saver._format.key_codec import FOLDERS, NODE_CACHE_PREFIX

    folder = next((s for s in key.split("/") if s in FOLDERS), None)
    return folder == NODE_CACHE_PREFIX.rstrip("/")


# -- policy evaluation ----------------------------------------------------------------
def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _iam_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM wildcard match: ``*`` any run of characters, ``?`` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _conditions_hold(condition: dict[str, Any], context: dict[str, str]) -> bool:
    for test, tests in condition.items():
        for key, expected in tests.items():
            actual = context.get(key)
            if actual is None:
                return False
            if test == "StringEquals":
                ok = actual in _as_list(expected)
            elif test == "StringLike":
                ok = any(_iam_match(e, actual) for e in _as_list(expected))
            elif test == "Bool":
                ok = actual.lower() in [str(e).lower() for e in _as_list(expected)]
            else:
                raise NotImplementedError(f"condition operator {test} is not evaluated by tests/infra_support.py")
            if not ok:
                return False
    return True


def allowed_by(policy: dict[str, Any], request: Request) -> list[str]:
    """Sids (or indexes) of the Allow statements that grant ``request``; empty when
    nothing does or a Deny statement matches."""
    granted: list[str] = []
    context = dict(request.context)
    for i, statement in enumerate(_as_list(policy["Statement"])):
        actions = _as_list(statement.get("Action", []))
        resources = _as_list(statement.get("Resource", []))
        if not any(_iam_match(a, request.action, case_sensitive=False) for a in actions):
            continue
        if not any(_iam_match(r, request.resource) for r in resources):
            continue
        if not _conditions_hold(statement.get("Condition", {}), context):
            continue
        if statement["Effect"] == "Deny":
            return []
        granted.append(statement.get("Sid", str(i)))
    return granted


def grants(policy: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(statement index, action, resource pattern) of every Allow a policy makes."""
    return [
        (i, action, resource)
        for i, statement in enumerate(_as_list(policy["Statement"]))
        if statement["Effect"] == "Allow"
        for action in _as_list(statement["Action"])
        for resource in _as_list(statement["Resource"])
    ]


def narrowed(policy: dict[str, Any], index: int, action: str, resource: str) -> dict[str, Any]:
    """A policy of one statement of ``policy``, reduced to one action on one resource."""
    statement = _as_list(policy["Statement"])[index]
    return {"Statement": [{**statement, "Action": action, "Resource": resource}]}


def statement_resources(policy: dict[str, Any]) -> list[tuple[str, str]]:
    """(action, resource pattern) pairs a policy grants."""
    return [(action, resource) for _, action, resource in grants(policy)]


# -- a real graph ---------------------------------------------------------------------
BIG_VALUE_BYTES = 200_000  # above S3Saver's inline threshold: stored (and read) as its own object


class Report(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    doc: str
    verdict: str


def _load(state: Report) -> dict[str, Any]:
    return {"doc": "d" * BIG_VALUE_BYTES, "log": ["load"]}


class Review(TypedDict, total=False):
    verdict: str


def _ask(state: Review) -> dict[str, Any]:
    return {"verdict": interrupt("approve?")}


def _finish(state: Report) -> dict[str, Any]:
    return {"log": [f"finish:{state['verdict']}"]}


def report_graph(checkpointer: Any) -> Any:
    """load (a large value) -> review (a subgraph that interrupts) -> finish.

    Covers the saver's paths: blob objects, namespaced checkpoints, pending writes
    and interrupts, resume, history, update_state and time travel.
    """
    review = StateGraph(Review).add_node("ask", _ask).add_edge(START, "ask").compile()
    return (
        StateGraph(Report)
        .add_node("load", _load)
        .add_node("review", review)
        .add_node("finish", _finish)
        .add_edge(START, "load")
        .add_edge("load", "review")
        .add_edge("review", "finish")
        .add_edge("finish", END)
        .compile(checkpointer=checkpointer)
    )


EXPECTED_LOG = ["load", "finish:yes"]


def fill_thread_sync(graph: Any, thread_id: str) -> None:
    """Run to the interrupt and resume: a thread with every kind of stored data."""
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"log": []}, config)
    assert graph.invoke(Command(resume="yes"), config)["log"] == EXPECTED_LOG


async def fill_thread_async(graph: Any, thread_id: str) -> None:
    config = {"configurable": {"thread_id": thread_id}}
    await graph.ainvoke({"log": []}, config)
    assert (await graph.ainvoke(Command(resume="yes"), config))["log"] == EXPECTED_LOG


def run_report_sync(graph: Any, thread_id: str) -> dict[str, Any]:
    """A user's session on invoke: run to the interrupt, resume, read state and
    history, edit state, replay from an earlier checkpoint."""
    config = {"configurable": {"thread_id": thread_id}}
    first = graph.invoke({"log": []}, config)
    assert "__interrupt__" in first, first
    final = graph.invoke(Command(resume="yes"), config)
    assert final["log"] == EXPECTED_LOG, final["log"]
    state = graph.get_state(config, subgraphs=True)
    assert state.values["log"] == EXPECTED_LOG
    history = list(graph.get_state_history(config))
    graph.update_state(config, {"log": ["edited"]})
    before_finish = next(s for s in history if s.next == ("finish",))
    graph.invoke(None, before_finish.config)  # time travel: replay from there
    list(graph.get_state_history(config, filter={"source": "update"}, limit=2))
    return final


async def run_report_async(graph: Any, thread_id: str) -> dict[str, Any]:
    """Same session as :func:`run_report_sync`, on ainvoke."""
    config = {"configurable": {"thread_id": thread_id}}
    first = await graph.ainvoke({"log": []}, config)
    assert "__interrupt__" in first, first
    final = await graph.ainvoke(Command(resume="yes"), config)
    assert final["log"] == EXPECTED_LOG, final["log"]
    state = await graph.aget_state(config, subgraphs=True)
    assert state.values["log"] == EXPECTED_LOG
    history = [s async for s in graph.aget_state_history(config)]
    await graph.aupdate_state(config, {"log": ["edited"]})
    before_finish = next(s for s in history if s.next == ("finish",))
    await graph.ainvoke(None, before_finish.config)
    [s async for s in graph.aget_state_history(config, filter={"source": "update"}, limit=2)]
    return final


# -- moto's CloudFormation, closer to AWS -------------------------------------------------
def moto_cloudformation_like_aws() -> None:
    """Two gaps of moto 5's CloudFormation that the templates meet, filled in the
    in-process moto server (idempotent; only stack creation changes):

    * ``!If [cond, value, !Ref AWS::NoValue]`` as a list item: AWS drops the item,
      moto keeps ``None`` (a policy statement ``None`` is refused as malformed);
    * ``AWS::DynamoDB::GlobalTable`` is not implemented: a stand-in creates the table
      (keys, billing, stream, TTL, per-replica KMS key and deletion protection) in
      each of its replicas' regions, with no replication between them.
    """
    from moto.cloudformation import parsing

    if getattr(parsing, "_infra_support_like_aws", False):
        return
    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        cleaned = original(resource_json, resources_map)
        if isinstance(resource_json, list) and isinstance(cleaned, list):
            return [item for item in cleaned if item is not None]
        return cleaned

    parsing.clean_json = clean_json
    _global_table_stand_in()
    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
    parsing._infra_support_like_aws = True


def _global_table_stand_in() -> None:
    from moto.core.common_models import CloudFormationModel
    from moto.dynamodb.models import dynamodb_backends

    class GlobalTableStandIn(CloudFormationModel):  # registered as a CloudFormationModel subclass
        # moto's model metaclass files each model under its service, the module's 2nd part.
        __module__ = "moto.dynamodb.infra_support"

        @staticmethod
        def cloudformation_name_type() -> str:
            return "TableName"

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::DynamoDB::GlobalTable"

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **_: Any
        ) -> Any:
            props = cloudformation_json["Properties"]
            here = None
            for replica in props["Replicas"]:
                sse = {**props.get("SSESpecification", {}), **replica.get("SSESpecification", {})}
                backend = dynamodb_backends[account_id][replica["Region"]]
                table = backend.create_table(
                    name=resource_name,
                    schema=props["KeySchema"],
                    throughput=None,
                    attr=props["AttributeDefinitions"],
                    global_indexes=props.get("GlobalSecondaryIndexes", []),
                    indexes=props.get("LocalSecondaryIndexes", []),
                    streams=props.get("StreamSpecification"),
                    billing_mode=props.get("BillingMode", "PROVISIONED"),
                    sse_specification=sse or None,
                    tags=[],
                    deletion_protection_enabled=replica.get("DeletionProtectionEnabled", False),
                    warm_throughput=None,
                )
                if "TimeToLiveSpecification" in props:
                    backend.update_time_to_live(resource_name, props["TimeToLiveSpecification"])
                if replica["Region"] == region_name:
                    here = table
            assert here is not None, "a global table has a replica in its stack's region"
            return here
