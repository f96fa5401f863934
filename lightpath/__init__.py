"""Lightpath: the client-facing package — generated stubs (lightpath.v1), the
client SDK (lightpath.client) and the `lightpath` CLI."""

__version__ = "0.1.0"
