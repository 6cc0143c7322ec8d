"""jigsaw: a serving node for compound ML inference (JigsawServe)."""

__version__ = "0.1.0"
