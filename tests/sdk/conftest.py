"""A real cell for the SDK's tests (tests/cell_scheduler/conftest.py's: two pods of 8
blocks, over TLS on a real Redis)."""

from __future__ import annotations

from tests.cell_scheduler.conftest import cell2

__all__ = ["cell2"]
