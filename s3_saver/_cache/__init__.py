"""The node cache: ``S3Cache`` (LangGraph's ``BaseCache``), a facade beside ``_saver/``.
Its operations are in ``_ops/node_cache``, its keys and documents in ``_format/node_cache``."""
