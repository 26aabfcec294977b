"""S3Store's migration of a store written without encryption (a mixin of ``S3Store``):
one operation (``_ops/memory/encrypt``) on the store's drivers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from s3_saver._format.memory.names import check_labels, registry_bounds
from s3_saver._ops.memory.encrypt import (
    NamespaceEncryptStatus,
    check,
    encrypt_namespaces,
)


class Encrypting:
    """``encrypt_namespaces`` / ``aencrypt_namespaces`` (see ``S3Store``)."""

    # Set by S3Store.
    _memory: Any
    _replicas: Any
    _sync: Any
    _async: Any

    def encrypt_namespaces(self, prefix: tuple[str, ...] = ()) -> Iterator[NamespaceEncryptStatus]:
        """Encrypt the items of every namespace under ``prefix`` (default: every
        namespace) that were written without encryption, under each namespace's own key:
        the store's ``encryption=`` turned on for a store that already holds items.

        For each namespace: its key is made first; every item still in plaintext is
        written again encrypted in its place (its value, its vectors, and a large value's
        object), keeping its times and expiry, each rewrite fenced on the item as read so
        that a put or delete landing meanwhile wins; then, on a versioned bucket, every
        noncurrent version and delete marker in the namespace's folder (the plaintext a
        versioned bucket kept) is deleted. Versions Object Lock holds stay, reported.

        Cut short after any request, call it again: it finishes, and passes over the
        namespaces done (a read of each). Meanwhile a store without ``encryption=``
        cannot read an item once encrypted (``EncryptedObjectError``) and an encrypting
        store cannot read one not encrypted yet (``PlaintextObjectError``): stop the
        writers, run it, start them with ``encryption=``, then run it once more.

        An admin call: it lists each namespace's folder on a versioned bucket
        (``s3:ListBucketVersions``, ``s3:DeleteObjectVersion``).

        Args:
            prefix: The namespace prefix (a tuple prefix: ``("users",)`` covers
                ``("users", "ann")``); ``()``: every namespace.

        Yields:
            A [NamespaceEncryptStatus][s3_saver.NamespaceEncryptStatus] per namespace,
            as it is done.

        Raises:
            ConfigurationError: The store has no ``encryption=``, or a replica (the
                replica bucket keeps the plaintext versions replication copied
                there: encrypt before adding the replica).
            NamespaceError: ``prefix`` is not a valid namespace prefix.
        """
        check(self._memory, self._replicas)  # refused now, not at the first status
        return self._sync.iterate(encrypt_namespaces(self._memory, self._encrypt_prefix(prefix), self._replicas))

    async def aencrypt_namespaces(self, prefix: tuple[str, ...] = ()) -> AsyncIterator[NamespaceEncryptStatus]:
        """Async version of [encrypt_namespaces()][s3_saver.S3Store.encrypt_namespaces]."""
        async for status in self._async.iterate(encrypt_namespaces(self._memory, self._encrypt_prefix(prefix), self._replicas)):
            yield status

    def _encrypt_prefix(self, prefix: tuple[str, ...]) -> tuple[str, ...]:
        prefix = check_labels(prefix, what="namespace prefix")
        registry_bounds(prefix)  # KeyTooLongError for a prefix no namespace can have
        return prefix
