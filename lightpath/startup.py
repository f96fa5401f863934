"""A process's start-up imports without the cyclic garbage collector (issue 31).

    from lightpath.startup import imports_without_gc

    with imports_without_gc():
        from lightpath_services.agg_switch.server import build
        ...

Importing creates hundreds of thousands of long-lived objects (modules, classes,
functions, protobuf descriptors) and almost no garbage, yet every 700 allocations
the collector traverses the youngest of them, and each full collection all of them:
about 15 % of a service's import CPU. So the collector is off for the imports; at
the end the objects they made are frozen (`gc.freeze`: moved to the permanent
generation, which no collection traverses) before it is switched back on, so the
first collection afterwards does not walk them all at once and no later one walks
them again (the `gc` module's documentation gives the same pairing, disable early and
freeze when the long-lived objects are made, for servers that fork).

Each service's `__main__` and the CLI's entry use it; it freezes what is alive in the
whole process, so it belongs where a process starts, not in library code.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_without_gc() -> Iterator[None]:
    """The collector off for the block; after it (raised or not), the objects alive
    are frozen and the collector is on again if it was on before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
