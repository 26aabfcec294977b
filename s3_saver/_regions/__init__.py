"""The regions a saver talks to: each region's site (bucket, index, clients), the replica's
settings and reports, how a read chooses a region, and the operations across two
(verify, promote, settle). Imports ``_ops`` and the floors below.
"""
