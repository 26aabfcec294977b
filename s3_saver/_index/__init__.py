"""Index backends behind one interface (see ``base``)."""
