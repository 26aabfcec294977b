"""The s3_saver benchmark: what every checkpointer call costs, per saver (``make bench``)."""
