"""Model backends behind one interface (``jigsaw.backends.base.Backend``)."""
