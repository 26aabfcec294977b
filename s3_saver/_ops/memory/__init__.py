"""The memory store's operations (``S3Store``), and what they decide without a request.

Pure parts, each equal to ``InMemoryStore``'s semantics except where its module
docstring names a deliberate difference: filters (``filters``), namespace pages
(``listing``), search order, scores and paging (``rank``), the texts an item is embedded
by (``embedding``), the checks and shape of a batch (``prepare``). The operation itself,
written once as a generator of calls for both drivers: ``batch``. No re-exports: every
import names its module.
"""
