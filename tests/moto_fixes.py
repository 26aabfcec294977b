"""Fixes to moto's server that make it behave as S3 and DynamoDB do under concurrency.

Used by the test session (tests/conftest.py) and by ``make bench``'s moto process
(benchmarks/moto_proc.py): both send concurrent conditional writes and transactions.
"""

from __future__ import annotations

import functools
import threading


def atomic_conditional_writes() -> None:
    """Make moto's conditional PutObject/DeleteObject atomic, as S3's are.

    moto checks ``If-Match``/``If-None-Match`` and stores the object in two steps
    with no lock between them, and its server answers each request on a thread of
    its own: two writers swapping the same head ETag can both get 200, and the
    second silently overwrites the first (a lost update S3 never allows). It was
    seen as one checkpoint missing after test_many_puts_while_segments_seal
    under CPU load. One lock around the check and the store closes that window."""
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_s3_saver_atomic", False):
        return
    lock = threading.RLock()

    def serialised(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            with lock:
                return method(self, *args, **kwargs)

        return wrapper

    S3Response.put_object = serialised(S3Response.put_object)
    S3Response.delete_object = serialised(S3Response.delete_object)
    S3Response._s3_saver_atomic = True
    _serialised_dynamodb(serialised)


def _serialised_dynamodb(serialised) -> None:
    """Make each moto DynamoDB request atomic with respect to the others, as
    DynamoDB's are.

    moto's ``transact_write_items`` deep-copies every table it touches and, when
    a condition fails, assigns the copy back: a write another request thread
    applied in between is lost (DynamoDB never does that). The saver's commits
    are transactions whose conditions fail in ordinary races (a retried attempt
    meeting its own write, a fence), so without this a concurrent test could
    see a committed checkpoint vanish (issue 21, item 6). Serialising the
    DynamoDB requests of the one moto server closes that window."""
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.responses import DynamoHandler

    if getattr(DynamoHandler, "_s3_saver_atomic", False):
        return
    DynamoHandler.call_action = serialised(DynamoHandler.call_action)
    DynamoHandler._s3_saver_atomic = True
    DynamoDBBackend.transact_write_items = _transact_write_items
    DynamoHandler.transact_write_items = _once_per_token(DynamoHandler.transact_write_items)


_TOKEN_WINDOW = 600.0  # seconds: DynamoDB honours a ClientRequestToken for 10 minutes


def _once_per_token(handler):
    """TransactWriteItems with a ``ClientRequestToken`` applied once, as DynamoDB does.

    DynamoDB answers a transaction sent again with the token of one that succeeded (within
    10 minutes, same parameters) with success, and applies nothing; other parameters under
    the same token are refused (IdempotentParameterMismatchException). moto ignores the
    token: a transaction sent again after a lost answer was applied twice (its item's
    condition then failed on its own write), which real DynamoDB never does. Requests run
    one at a time (``call_action`` is serialised above), so a dict is enough."""
    import json
    import time

    done: dict[str, tuple[float, str, object]] = {}

    @functools.wraps(handler)
    def wrapper(self, *args, **kwargs):
        token = self.body.get("ClientRequestToken")
        if not token:
            return handler(self, *args, **kwargs)
        now = time.monotonic()
        for old in [t for t, (at, _, _) in done.items() if now - at > _TOKEN_WINDOW]:
            del done[old]
        # moto's body holds binary attribute values decoded (bytes): they are part of the parameters.
        body = json.dumps({k: v for k, v in self.body.items() if k != "ClientRequestToken"}, sort_keys=True, default=_plain)
        if token in done:
            _, first, answer = done[token]
            if first != body:
                from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException

                raise DynamodbException(
                    ERROR_TYPE_PREFIX + "IdempotentParameterMismatchException",
                    "The request with the client token was already used with other parameters",
                )
            return answer
        answer = handler(self, *args, **kwargs)  # raises when the transaction is refused: nothing kept
        done[token] = (now, body, answer)
        return answer

    return wrapper


def _plain(value: object) -> str:
    return value.hex() if isinstance(value, (bytes, bytearray)) else repr(value)


def _transact_write_items(backend, transact_items):
    """moto's TransactWriteItems without its snapshot of every table touched.

    moto deep-copies each table a transaction touches (to roll back when a
    condition fails): every transaction costs the whole table, and a thread of
    a thousand checkpoints (every commit is a transaction) timed out. Under the
    lock above nothing else runs meanwhile, so the same semantics need no copy:
    every condition is checked first (against the items as they are, with
    ReturnValuesOnConditionCheckFailure), and only if all hold are the actions
    applied, exactly as moto applies them."""
    from moto.dynamodb.exceptions import (
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
    )
    from moto.dynamodb.comparisons import get_filter_expression as condition

    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    seen = set()
    errors = []
    actions = []
    for item in transact_items:
        if len(item) > 1:
            from moto.dynamodb.exceptions import TransactWriteSingleOpException

            raise TransactWriteSingleOpException
        op_type, op = next(iter(item.items()))
        table = backend.get_table(op["TableName"])
        if op_type == "Put":
            key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
            if table.range_key_attr is not None:
                key[table.range_key_attr] = op["Item"][table.range_key_attr]
        else:
            key = op["Key"]
        marker = (op["TableName"], str(dict(sorted(key.items()))))
        if marker in seen:
            raise MultipleTransactionsException()
        seen.add(marker)
        current = backend.get_item(op["TableName"], key)
        expression = op.get("ConditionExpression")
        if expression is not None and not condition(
            expression, op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
        ).expr(current):
            old = current.to_json()["Attributes"] if current and op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" else None
            errors.append(("ConditionalCheckFailed", "The conditional request failed", old))
        else:
            errors.append((None, None, None))
        actions.append((op_type, op, key))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    for op_type, op, key in actions:
        names, values = op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
        if op_type == "Put":
            backend.put_item(op["TableName"], op["Item"], expression_attribute_names=names, expression_attribute_values=values)
        elif op_type == "Delete":
            backend.delete_item(op["TableName"], key, expression_attribute_names=names, expression_attribute_values=values)
        elif op_type == "Update":
            backend.update_item(op["TableName"], key, op["UpdateExpression"], names, values)


def fast_dispatch() -> None:
    """Cache how moto's server maps a request's host to a service.

    For every request, ``DomainDispatcherApplication.get_backend_for_host`` lists
    moto's package folder (about 200 ``isdir`` calls) and then tries every
    service's URL patterns in turn: about a tenth of the suite's CPU time, for an
    answer that depends on the host alone and never changes while the server runs.
    Behaviour is unchanged: the same host gets the same backend (None included),
    now from a dict."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    if getattr(DomainDispatcherApplication, "_s3_saver_cached", False):
        return
    lookup = DomainDispatcherApplication.get_backend_for_host
    cache: dict[str | None, object] = {}

    @functools.wraps(lookup)
    def cached(self, host):
        try:
            return cache[host]
        except KeyError:
            cache[host] = backend = lookup(self, host)
            return backend

    DomainDispatcherApplication.get_backend_for_host = cached
    DomainDispatcherApplication._s3_saver_cached = True


def multi_region_kms_keys() -> None:
    """Make what a multi-Region KMS key encrypts decrypt, in its region and its replicas', as
    KMS does.

    moto's ciphertext blob keeps 36 characters of the key id: a multi-Region key's id
    (``mrk-`` and 36 more) is cut, its key is not found, and every Decrypt is refused. The
    keys are looked up by the cut id as well, and the answer names the whole id."""
    from moto.kms import models, utils

    if getattr(utils, "_s3_saver_mrk", False):
        return
    original = utils.decrypt
    size = utils.KEY_ID_LEN

    def decrypt(master_keys, ciphertext_blob, encryption_context):  # type: ignore[no-untyped-def]
        cut = {k[:size]: k for k in master_keys if len(k) > size}
        keys = {**master_keys, **{short: master_keys[whole] for short, whole in cut.items()}}
        plaintext, key_id = original(keys, ciphertext_blob, encryption_context)
        return plaintext, cut.get(key_id, key_id)

    utils.decrypt = decrypt
    models.decrypt = decrypt
    utils._s3_saver_mrk = True



def disabled_kms_keys() -> None:
    """Make a disabled KMS key refuse to encrypt, decrypt and re-encrypt (DisabledException),
    as KMS does; moto uses a disabled key as any other. (A key rotation's tests disable a
    key to show what a process that may not use it is told.)"""
    from moto.core.exceptions import JsonRESTError
    from moto.kms import models

    if getattr(models, "_s3_saver_disabled", False):
        return
    backend = models.KmsBackend

    def check(self, key_id):  # type: ignore[no-untyped-def]
        key = self.keys.get(self.any_id_to_key_id(key_id))
        if key is not None and not key.enabled:
            raise JsonRESTError("DisabledException", f"{key.arn} is disabled.")

    original_decrypt, original_encrypt = backend.decrypt, backend.encrypt

    def decrypt(self, ciphertext_blob, encryption_context, key_id=None):  # type: ignore[no-untyped-def]
        plaintext, arn = original_decrypt(self, ciphertext_blob, encryption_context, key_id)
        check(self, arn)
        return plaintext, arn

    def encrypt(self, key_id, plaintext, encryption_context):  # type: ignore[no-untyped-def]
        check(self, key_id)
        return original_encrypt(self, key_id, plaintext, encryption_context)

    backend.decrypt, backend.encrypt = decrypt, encrypt  # generate_data_key and re_encrypt call these
    models._s3_saver_disabled = True
