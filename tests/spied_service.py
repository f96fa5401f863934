"""`python -m tests.spied_service <service>`: the service's process exactly as
`python -m services.<service>` runs it, with one spy for tests/test_limits.py.

Every call of the test's (the MARKER key in its metadata) that reaches the service's
own handler (past what every call passes first: authentication, authorization, the
request limits, admission) writes its method, one line, to the file
LIGHTPATH_TEST_ENTERED names, before the handler runs.
A test reads it to know that a refused request cost the service no handler work.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from lightpath_services.common import telemetry

MARKER = "lightpath-test-spied"  # metadata key of the calls the spy logs


def _spy(behaviour: Any, method: str, log: Any) -> Any:
    if behaviour is None:
        return None

    def entered(request: Any, context: Any) -> Any:
        # Only the test's own calls (its marker in the metadata): the service's peers
        # call it meanwhile (a workload scheduler's heartbeats to the cell).
        if any(k == MARKER for k, _ in context.invocation_metadata() or ()):
            log.write(method + "\n")  # line-buffered: on disk before the answer is sent
        return behaviour(request, context)

    return entered


def main() -> None:
    service = sys.argv[1]
    log = open(os.environ["LIGHTPATH_TEST_ENTERED"], "a", buffering=1)
    wrap = telemetry.ServerInterceptor._wrap

    def spied(self: Any, handler: Any, method: str) -> Any:
        kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        inner = handler._replace(**{k: _spy(getattr(handler, k), method, log) for k in kinds})
        return wrap(self, inner, method)

    telemetry.ServerInterceptor._wrap = spied  # type: ignore[method-assign]
    sys.argv = [f"lightpath_services.{service}"]
    runpy.run_module(f"lightpath_services.{service}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
