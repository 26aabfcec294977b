"""What the memory store (``S3Store``) stores, and how it is spelled.

Namespaces, keys, their limits, registry keys and node ids (``names``); the row and
vector formats (``rows``); TTL arithmetic on stored expiries and the store's clock
(``ttl``); the manifest mode's documents and their keys (``documents``). No
re-exports: every import names its module.
"""
