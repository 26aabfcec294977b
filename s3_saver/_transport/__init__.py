"""How calls reach the store: the sans-I/O protocol operations yield, the AWS error codes
it maps, every answer checked, the retry policy, boto3/aioboto3 clients, S3 call
builders, the checks that ride on a process's first wave (a table's owner, a prefix's
index mode), the sync and async drivers, and the one memory budget every cache is
charged to. Imports ``_format`` and ``errors``.
"""
