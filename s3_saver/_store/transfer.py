"""S3Store's export and import of memory (a mixin of ``S3Store``): a versioned file of
items (``_format/memory/export``), written through the store's own commit path, so a
namespace is listed before its items are readable and large values go to objects first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from s3_saver._crypto.sealer import PLAIN
from s3_saver._format.memory import rows
from s3_saver._format.memory.export import (
    ExportedItem,
    MemoryExport,
    decode_export,
    encode_export,
)
from s3_saver._format.memory.names import check_labels, registry_key, show
from s3_saver._ops.memory import embedding, sealing
from s3_saver._ops.memory.transfer import MemoryImportReport, export_items, import_items
from s3_saver.errors import ConfigurationError, CorruptObjectError, EncryptedObjectError

_WHERE = "the memory export given to import_memory"


class Transfer:
    """``export_memory``/``import_memory`` and their async forms (see ``S3Store``)."""

    # Set by S3Store: its memory operation's context, drivers, serializer and index settings.
    _memory: Any
    _sync: Any
    _async: Any
    _dims: int
    _fields: Any
    embeddings: Any
    index_config: dict[str, Any] | None
    serde: Any
    clock: Any

    # -- export, import ----------------------------------------------------------------

    def export_memory(self, prefix: tuple[str, ...] = ()) -> bytes:
        """Every item under a namespace prefix, as bytes (see [import_memory()][s3_saver.S3Store.import_memory]).

        The file holds each item's value as the store's serializer wrote it (an
        encrypting serializer's values stay encrypted), its `created_at`, `updated_at`
        and expiry, and its vectors; items already expired are left out. Namespaces are
        read one after another: writes landing meanwhile may or may not be in it. The
        whole export is built in memory.

        Args:
            prefix: The namespace prefix to export (`()`: every namespace).

        Returns:
            A JSON-lines document, versioned (`s3_saver.memory-export/1`).
        """
        prefix = self._export_prefix(prefix)
        return self._encode(prefix, self._sync.run(export_items(self._memory, prefix)))

    async def aexport_memory(self, prefix: tuple[str, ...] = ()) -> bytes:
        """Async version of [export_memory()][s3_saver.S3Store.export_memory]."""
        prefix = self._export_prefix(prefix)
        return self._encode(prefix, await self._async.run(export_items(self._memory, prefix)))

    def import_memory(self, data: bytes) -> MemoryImportReport:
        """Write the items of [export_memory()][s3_saver.S3Store.export_memory]'s bytes into this
        store: any bucket, prefix or index mode.

        Each item keeps its `created_at`, `updated_at` and expiry (expired ones are not
        written). An item the store holds already with the same times is left alone, so
        an import cut short is finished by running it again. An item it holds in another
        version is replaced; other items stay.

        The whole file is checked first (its format, every line, every value read by this
        store's serializer): a bad file writes nothing. Vectors: without an index, or with
        the index (`dims` and `fields`) the file's were made for, they are written as
        they are; with another index, this store's embedder computes them again.

        Args:
            data: The export.

        Returns:
            What was written, and what was already there or expired.

        Raises:
            CorruptObjectError: Not an export this store reads, a line it does not
                write, or a file cut short (each named by its line).
            SerializationError: A value this store's serializer cannot read.
        """
        export, opening = self._decoded(data)
        if opening is not None:
            export = replace(export, items=self._sync.run(opening))
        items, texts, places = self._import_plan(export)
        vectors = self.embeddings.embed_documents(texts) if texts and self.embeddings is not None else []
        items, embedded = self._embedded(items, texts, places, vectors)
        report = self._sync.run(import_items(self._memory, items, self.clock.now()))
        return replace(report, embedded=embedded)

    async def aimport_memory(self, data: bytes) -> MemoryImportReport:
        """Async version of [import_memory()][s3_saver.S3Store.import_memory]."""
        export, opening = self._decoded(data)
        if opening is not None:
            export = replace(export, items=await self._async.run(opening))
        items, texts, places = self._import_plan(export)
        vectors = await self.embeddings.aembed_documents(texts) if texts and self.embeddings is not None else []
        items, embedded = self._embedded(items, texts, places, vectors)
        report = await self._async.run(import_items(self._memory, items, self.clock.now()))
        return replace(report, embedded=embedded)

    def _index_signature(self) -> dict[str, Any] | None:
        """What an export's vectors were made for: the store's ``dims`` and ``fields``."""
        if self.index_config is None:
            return None
        return {"dims": self._dims, "fields": list(self.index_config.get("fields") or ["$"])}

    def _export_prefix(self, prefix: Any) -> tuple[str, ...]:
        prefix = check_labels(prefix, what="namespace prefix")
        registry_key(prefix)
        return prefix

    def _encode(self, prefix: tuple[str, ...], items: list[ExportedItem]) -> bytes:
        sealed = None
        crypt = self._memory.crypt
        if crypt is not None:
            # Where the keys its items are sealed under live (an import reads them there).
            sealed = {"bucket": crypt.bucket, "prefix": crypt.prefix, "key_bucket": crypt.key_bucket}
        return encode_export(MemoryExport(prefix, self.clock.now(), self._index_signature(), items, sealed=sealed))

    def _decoded(self, data: Any) -> tuple[MemoryExport, Any]:
        """The export in ``data``, and the operation that opens its items (None: plain)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(f"import_memory takes the bytes export_memory returned, got {type(data).__name__}")
        export = decode_export(bytes(data), _WHERE)
        if export.sealed is None:
            return export, None
        crypt = self._memory.crypt
        if crypt is None:
            raise EncryptedObjectError(
                f"{_WHERE}: written encrypted by a store (s3://{export.sealed['bucket']}/"
                f"{export.sealed['prefix']}, key store s3://{export.sealed['key_bucket']}); this store has no "
                "encryption=: pass the KmsKey(...) or LocalKey(...) it was written with"
            )
        source = replace(
            self._memory,
            crypt=crypt.elsewhere(export.sealed["bucket"], export.sealed["prefix"], export.sealed["key_bucket"]),
            sealer=PLAIN,
        )
        return export, sealing.open_export(source, export.items, _WHERE)

    def _import_plan(self, export: MemoryExport) -> tuple[list[ExportedItem], list[str], list[list[tuple[int, str]]]]:
        """The file's items (opened), checked, and (when this store re-embeds them) the texts to
        embed and where each one's vector goes (``embedding.TextPlan``)."""
        where = _WHERE
        values = []
        for item in export.items:
            at = f"{where}: namespace {show(item.namespace)}, key {show(item.key)}"
            # Read by this store's serializer before anything is written: a file written
            # with another serializer (or key) is refused whole, never stored unreadable.
            values.append(rows.unpack_value(self.serde, item.value, at))
        signature = self._index_signature()
        if signature is None or export.index == signature:
            items = [self._carried(item, where) for item in export.items]
            return items, [], []
        # Another index (or none) made the file's vectors: this store's fields and embedder decide.
        assert self._fields is not None
        plan = embedding.plan_texts([(value, None) for value in values], self._fields)
        return [replace(item, vectors=None) for item in export.items], plan.texts, plan.places

    def _carried(self, item: ExportedItem, where: str) -> ExportedItem:
        """An item's vectors as the file holds them; with an index, in its ``dims`` and
        this store's element type."""
        cell = item.vectors
        if cell is None or self.index_config is None:
            return item
        if cell.dims != self._dims:
            raise CorruptObjectError(
                f"{where}: namespace {show(item.namespace)}, key {show(item.key)}: vectors of {cell.dims} dims;"
                f" the file's index has dims={self._dims}"
            )
        if cell.dtype == self._memory.dtype:
            return item
        return replace(item, vectors=rows.pack_vectors(cell.by_path(), self._dims, self._memory.dtype))

    def _embedded(
        self, items: list[ExportedItem], texts: list[str], places: list[list[tuple[int, str]]], answers: list[Any]
    ) -> tuple[list[ExportedItem], int]:
        if not texts:
            return items, 0
        plan = embedding.TextPlan(texts, places)
        found = embedding.vectors_for_puts(plan, answers, self._dims, [(i.namespace, i.key) for i in items])
        packed = [replace(item, vectors=rows.pack_vectors(v, self._dims, self._memory.dtype)) for item, v in zip(items, found)]
        return packed, sum(1 for v in found if v)
