"""The DynamoDB index backend (``backend.DynamoIndex``): the table, its items, the
thread listing and run hints, a thread as a whole, archival. Imports the shared
``_index`` modules and the floors below; never ``_index.manifest``.
"""
