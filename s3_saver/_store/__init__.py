"""The store's pure core: what ``S3Store`` (LangGraph's ``BaseStore``: long-term memory)
decides without sending a request.

Namespaces, keys and their limits (``names``), filters (``filters``), namespace
listings (``listing``), search order, scores and paging (``rank``), the texts an item
is embedded by (``embedding``), the row and vector formats (``rows``), TTL arithmetic
and the store's clock (``ttl``), and the validation and shape of a batch
(``prepare``). Each equals ``InMemoryStore``'s semantics except where its module
docstring names a deliberate difference.

These modules import nothing of the package but ``s3_saver.errors`` (and langgraph,
ormsgpack and the standard library), so they can move down a floor (the format and
the operations) without change. No re-exports: every import names its module.
"""
