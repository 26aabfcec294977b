"""The manifest index backend (``backend.ManifestIndex``): a per-thread head in the bucket
swapped by compare-and-swap, sealed segments, group commit. Imports the shared
``_index`` modules and the floors below; never ``_index.dynamodb``.
"""
