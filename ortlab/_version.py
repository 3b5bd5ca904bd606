"""ortlab's version: read by the package build (hatch) and shown by `ortlab --version`."""

__version__ = "0.1.0"
