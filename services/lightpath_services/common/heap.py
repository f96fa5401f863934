"""Memory a refused request used goes back to the system (issue 30).

A request over a field limit is parsed before it is refused (lightpath.limits), and
a parse of a few MB of small messages fills glibc's heaps with many small blocks.
Freed, glibc keeps them: the process's RSS stays tens of MB higher after each such
request. Two settings of glibc's allocator keep it honest, at no cost to the rest:

* `bound_heap()` (once, at process start) fixes the size above which an allocation
  is its own mapping (M_MMAP_THRESHOLD, 256 KiB). glibc otherwise raises it to the
  largest block freed so far (up to 32 MiB), so after one large request every later
  receive buffer of that size stays in the heap when freed;
* `give_back()` (after refusing a large request) returns the heaps' free pages
  (malloc_trim), a few ms for a heap of ~100 MB.

Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("lightpath.heap")

M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc malloc.h)
MMAP_THRESHOLD = 256 << 10
# A refused request at least this large (encoded) gives its memory back at once.
GIVE_BACK_ABOVE = 1 << 20


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 (glibc only)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def bound_heap() -> None:
    libc = _glibc()
    if libc is not None and not libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.warning("mallopt(M_MMAP_THRESHOLD) refused: large blocks stay in the heap")


def give_back() -> None:
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
