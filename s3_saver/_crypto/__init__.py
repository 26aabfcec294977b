"""Encryption that can erase (``encryption=``): every stored byte of a thread's content
sealed with that thread's own data key, bound to its place, the data key kept wrapped in a
key store that keeps no old copy.

``config`` holds the public settings (``KmsKey``, ``LocalKey``); ``envelope`` the sealed
byte format and its associated data; ``records`` the key store's records; ``keyrings``
how a data key is made and unwrapped (KMS calls yielded as any other call, or a local
master key); ``store`` the key store's operations (get, create, destroy); ``keys`` the
saver's keys (cache, loading) and the sealer an operation carries. Imports ``_transport``,
``_format`` and ``errors``.
"""
