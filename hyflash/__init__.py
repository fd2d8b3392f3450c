"""HyFlash: export pipeline and reference runtime for a compact parallel drafter."""

__version__ = "0.1.0"
