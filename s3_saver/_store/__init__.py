"""The memory store: ``S3Store`` (LangGraph's ``BaseStore``), a facade over the memory
operations (``_ops/memory``) and index (``_index/memory``) on the saver's drivers."""
