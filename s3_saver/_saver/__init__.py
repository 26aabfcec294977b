"""The facade: ``S3Saver`` and its method groups (each method one line: an operation and a
driver), and the settings it is built from. Imports ``_regions`` and the floors below.
"""
