"""The saver's boto3 and aioboto3 clients: defaults, and async clients that reach the same store.

The sync clients are the user's (``s3_client=``, ``dynamodb_client=``) or made
from ``boto3_session=`` / the default session. The async clients are made from
the same endpoint, region, config and credentials, so ``graph.ainvoke`` never
talks to another store than ``graph.invoke``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import uuid
from typing import Any

from botocore.config import Config
from botocore.credentials import RefreshableCredentials

from s3_saver._format.keys import new_token
from s3_saver._transport.answers import watch
from s3_saver.errors import ConfigurationError, Where

# Lambda-minded defaults: an unreachable store fails in seconds, not minutes.
CONNECT_TIMEOUT = 2
READ_TIMEOUT = 5  # seconds without a byte received, per attempt
# botocore sends each request once: the saver retries in its operation core
# (``_transport/retry``), the same way for both drivers. A ``client_config`` that asks for
# botocore retries gets them as well, under the saver's.
TOTAL_MAX_ATTEMPTS = 1
_ATTEMPT_KEYS = {"max_attempts", "total_max_attempts"}
_AWS_ENDPOINT_MARK = ".amazonaws.com"
# KMS only with ``encryption=KmsKey(...)``: its client is made at the first KMS call.
SERVICES = ("s3", "dynamodb", "kms")


def client_config(user: Config | None, *, max_concurrency: int, path_style: bool) -> Config:
    """The saver's defaults with ``user`` merged over them.

    ``Config.merge`` replaces dict options whole, so ``retries`` and ``s3`` are
    merged key by key: ``Config(retries={"max_attempts": 1})`` keeps standard mode.
    """
    defaults = Config(
        retries={"mode": "standard", "total_max_attempts": TOTAL_MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        max_pool_connections=max(10, max_concurrency),
        # Path-style addressing is what S3-compatible servers on a custom endpoint expect.
        s3={"addressing_style": "path"} if path_style else None,
    )
    if user is None:
        return defaults
    merged = defaults.merge(user)
    nested: dict[str, Any] = {}
    for option in ("retries", "s3"):
        ours, theirs = getattr(defaults, option), getattr(user, option)
        if ours and theirs:
            combined = dict(ours)
            if option == "retries" and _ATTEMPT_KEYS & theirs.keys():
                # botocore prefers total_max_attempts over max_attempts: the user's
                # count of either kind replaces ours.
                for key in _ATTEMPT_KEYS:
                    combined.pop(key, None)
            combined.update(theirs)
            nested[option] = combined
    return merged.merge(Config(**nested)) if nested else merged


def custom_endpoint(url: str | None) -> str | None:
    """``url`` unless it is an AWS endpoint (named in messages only when custom)."""
    return None if url is None or _AWS_ENDPOINT_MARK in url else url


class Clients:
    """Client factories for the two drivers (called lazily, at the first call)."""

    def __init__(
        self,
        *,
        where: Where,
        region_name: str | None,
        endpoints: dict[str, str | None],
        config: Config,
        boto3_session: Any,
        given: dict[str, Any],
        aioboto3_session: Any,
        service_regions: dict[str, str | None] | None = None,
    ) -> None:
        self.where = where
        # The region of the clients the saver makes itself: AWS_REGION too, as the AWS CLI
        # and the other SDKs read it (boto3 reads only AWS_DEFAULT_REGION and the config
        # files, which it still falls back to). A session or clients given keep their own.
        if region_name is None and boto3_session is None and aioboto3_session is None:
            region_name = os.environ.get("AWS_REGION") or None
        self.region_name = region_name
        # A service whose region is its own (a KMS key named by its ARN lives in the
        # ARN's region), whatever the others'.
        self.service_regions = {k: v for k, v in (service_regions or {}).items() if v}
        self.endpoints = {service: endpoints.get(service) for service in SERVICES}
        self.config = config
        self.boto3_session = boto3_session
        self.given = given
        self.aioboto3_session = aioboto3_session
        for service in SERVICES:
            client = given.get(service)
            if client is not None:
                where.regions[service] = client.meta.region_name
                where.endpoints[service] = custom_endpoint(client.meta.endpoint_url)
            else:
                where.regions[service] = self._region(service) or getattr(boto3_session, "region_name", None)
                where.endpoints[service] = self.endpoints[service]

    def make_sync(self, service: str) -> Any:
        if self.given.get(service) is not None:
            return prepare(self.given[service])
        kwargs = {"region_name": self._region(service), "endpoint_url": self.endpoints[service], "config": self.config}
        if self.boto3_session is not None:
            client = self.boto3_session.client(service, **kwargs)
        else:
            with _DEFAULT_LOCK:  # a boto3 Session is not thread-safe; savers may be built on any thread
                client = _default_session().client(service, **kwargs)
        self._learn_region(service, client.meta.region_name)
        return prepare(client)

    def make_async(self, service: str) -> Any:
        """An aioboto3 client (an async context manager) for the same store as the sync one.

        Raises:
            ConfigurationError: The sync side's credentials refresh themselves and
                come from no named profile, so they cannot be handed to aioboto3.
        """
        aioboto3 = _import_aioboto3()
        given = self.given.get(service)
        if given is not None:
            region, config = given.meta.region_name, given.meta.config
            # An AWS endpoint follows from the region (and keeps the SDK's endpoint rules).
            endpoint = custom_endpoint(given.meta.endpoint_url)
            session = self.aioboto3_session or _session_with(
                aioboto3, _credentials_of(given), None, region, f"{service}_client"
            )
        else:
            region = self._region(service)
            endpoint, config = self.endpoints[service], self.config
            session = self.aioboto3_session
            if session is None and self.boto3_session is not None:
                boto = self.boto3_session
                region = region or boto.region_name
                profile = boto._session.get_config_variable("profile")
                session = _session_with(aioboto3, boto.get_credentials(), profile, region, "boto3_session")
            if session is None:
                session = _shared_models(aioboto3.Session())
            self._learn_region(service, region or session.region_name)
        return session.client(service, region_name=region, endpoint_url=endpoint, config=config)

    def _region(self, service: str) -> str | None:
        return self.service_regions.get(service) or self.region_name

    def _learn_region(self, service: str, region: str | None) -> None:
        if self.where.regions.get(service) is None:
            self.where.regions[service] = region


_DEFAULT_LOCK = threading.Lock()
_DEFAULT_SESSION: Any = None


def _default_session() -> Any:
    """One boto3 session per process for the savers given no session or clients, as
    ``boto3.client()`` has: a new session loads the service models and resolves the
    credentials again, ~30 ms a client, which a Lambda handler that builds its saver
    per invocation would pay every time. Called under ``_DEFAULT_LOCK``."""
    global _DEFAULT_SESSION
    if _DEFAULT_SESSION is None:
        import boto3

        _DEFAULT_SESSION = boto3.session.Session()
    return _DEFAULT_SESSION


def _import_aioboto3() -> Any:
    try:
        import aioboto3
    except ImportError as exc:
        raise ImportError(
            "the async methods need aioboto3: pip install '.[async]' in a checkout of "
            "s3_saver (or its path instead of '.'), or pip install aioboto3"
        ) from exc
    return aioboto3


def _credentials_of(client: Any) -> Any:
    # botocore exposes a client's credentials only through its request signer.
    signer = getattr(client, "_request_signer", None)
    return getattr(signer, "_credentials", None)


# The parsed service models (S3, DynamoDB, endpoint rules) of the aioboto3 sessions the
# saver makes, shared between them. Async clients live per event loop, and an async Lambda
# handler runs each invocation on a new loop: without this, every invocation's session
# parses the models again (~150 ms of CPU for the two clients, ~15 ms with it). Only the
# saver's own sessions without a profile share it (the same search paths, so the same
# answers: a profile may name a ``data_path`` of its own); a session the user passes keeps
# its own loader.
_AIO_MODELS: dict[Any, Any] = {}


def _shared_models(session: Any) -> Any:
    # botocore's Loader memoises in ``_cache`` (its ``instance_cache``): give it ours.
    session._session.get_component("data_loader")._cache = _AIO_MODELS
    return session


def _session_with(aioboto3: Any, credentials: Any, profile: str | None, region: str | None, source: str) -> Any:
    """An aioboto3 session holding the same credentials as the sync side."""
    if profile:
        # The profile resolves (and refreshes) its credentials the same way in aioboto3.
        return aioboto3.Session(profile_name=profile, region_name=region)
    if credentials is None:
        return _shared_models(aioboto3.Session(region_name=region))
    if isinstance(credentials, RefreshableCredentials):
        raise ConfigurationError(
            f"the async methods cannot use the credentials of {source}=: they refresh themselves "
            f"(method {getattr(credentials, 'method', None)!r}) and come from no named profile, so a "
            "copy would expire. Pass aioboto3_session= (an aioboto3.Session with the same "
            "credentials) to the saver"
        )
    frozen = credentials.get_frozen_credentials()
    return _shared_models(aioboto3.Session(
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
        region_name=region,
    ))


def prepare(client: Any) -> Any:
    """A client of either driver, as the saver sends its requests and reads its answers:
    see ``no_uuid4``, ``_upload_integrity`` and ``answers.watch``."""
    client.meta.events.register("before-call.s3.PutObject", _upload_integrity, unique_id="s3_saver-integrity")
    watch(client)
    return no_uuid4(client)


def _upload_integrity(params: dict[str, Any], **kwargs: Any) -> None:
    """Every PutObject the saver sends carries an integrity check: a Content-MD5 when
    botocore sends no checksum of its own.

    botocore 1.36+ sends a CRC32 on PutObject by default, but not with
    ``request_checksum_calculation="when_required"`` (set for stores that refuse flexible
    checksums). Without either header S3 stores a body damaged in transit as it came, and
    an Object Lock bucket refuses the upload (InvalidRequest: "Content-MD5 OR
    x-amz-checksum- HTTP header is required"). Content-MD5 is the header every S3-compatible
    store accepts. Runs at ``before-call``, after botocore decided its checksum
    (``context["checksum"]``) and before it applies it. S3 Express (directory buckets, which
    have no Object Lock) refuses MD5: it is left as configured.
    """
    headers, context = params["headers"], params["context"]
    if context.get("checksum", {}).get("request_algorithm"):
        return
    if context.get("endpoint_properties", {}).get("backend") == "S3Express":
        return
    if any(name.lower() == "content-md5" or name.lower().startswith("x-amz-checksum-") for name in headers):
        return
    body = params.get("body")
    if isinstance(body, (bytes, bytearray)):
        data = bytes(body)
    elif hasattr(body, "seek") and hasattr(body, "tell"):
        # botocore hands a streaming payload (the saver's bytes) over as a BytesIO.
        start = body.tell()
        data = body.read()
        body.seek(start)
    else:
        return
    digest = hashlib.md5(data, usedforsecurity=False).digest()
    headers["Content-MD5"] = base64.b64encode(digest).decode("ascii")


def no_uuid4(client: Any) -> Any:
    """The client, made to draw no ``uuid.uuid4``: botocore draws one per request
    (the retry invocation id) unless the request's context has one already. A
    user's tests may patch ``uuid.uuid4`` with a fixed sequence (LangGraph's own
    do) and compare the ids their graph makes: the saver's requests must not
    consume it. The ids come from the OS's generator instead."""
    client.meta.events.register("before-call", _invocation_id, unique_id="s3_saver-invocation-id")
    return client


def _invocation_id(context: dict[str, Any] | None = None, **kwargs: Any) -> None:
    if context is not None:
        context.setdefault("retries", {}).setdefault("invocation-id", str(uuid.UUID(new_token(), version=4)))


# A bucket name: S3's rules as loose as its legacy names in us-east-1 (capitals and
# underscores, up to 255), which still work and may hold years of threads. It catches
# what never names a bucket (an s3:// URL, a path, spaces) before the first request.
BUCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{1,253}[A-Za-z0-9]$")
BUCKET_RULE = (
    "letters, digits, dots and hyphens, starting and ending with a letter or digit; "
    "the name alone, without s3:// or a prefix: the prefix goes in prefix="
)
# DynamoDB's table naming rules.
TABLE_NAME = re.compile(r"^[a-zA-Z0-9_.\-]{3,255}$")
TABLE_RULE = "3-255 letters, digits, '_', '-', '.'"


def bucket_name_ok(name: str) -> bool:
    return bool(BUCKET_NAME.match(name)) and ".." not in name
