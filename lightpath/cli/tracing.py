"""Each CLI command is one trace (X-2): a span named after the command, current while
it runs, so every call it makes (through lightpath.client.channel, whose interceptors
start CLIENT spans under the current span and send its context along) continues the
same trace through the cell, the pod's workload scheduler and its ocs_manager.

The trace id is printed (on stderr) with every error, and always with `--verbose`, so
a person can find the command's spans and log lines in the services. Spans are
exported per OTEL_TRACES_EXPORTER (none by default; `console` writes them to stderr,
or to LIGHTPATH_OTEL_CONSOLE_FILE, never to stdout, which is the command's output).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

_provider: TracerProvider | None = None


def _tracer_provider() -> TracerProvider:
    """The process's SDK tracer provider: the global one if one is set, else one made
    (and set global) for the CLI, so trace ids are real even with nothing exported."""
    global _provider
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    if _provider is None:
        from lightpath.telemetry import configure_tracing

        _provider = configure_tracing(
            "lightpath-cli",
            console_file=os.environ.get("LIGHTPATH_OTEL_CONSOLE_FILE") or "stderr",
            set_global=True,
        )
    return _provider


def trace_id() -> str:
    """The current trace's id (32 hex digits), '' outside a command's span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


_printed: set[str] = set()


def print_trace_id() -> None:
    """`trace: <id>` on stderr, once per command."""
    tid = trace_id()
    if tid and tid not in _printed:
        _printed.add(tid)
        print(f"trace: {tid}", file=sys.stderr)


@contextlib.contextmanager
def command_span(words: list[str]) -> Iterator[trace.Span]:
    """The command's span (`lightpath submit`, ...), current for the block; ended (and,
    with an exporter, flushed) after it."""
    provider = _tracer_provider()
    name = " ".join(["lightpath", *words])
    tracer = provider.get_tracer("lightpath.cli")
    try:
        with tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes={"lightpath.cli.command": name}
        ) as span:
            yield span
    finally:
        provider.force_flush(timeout_millis=2000)


def failed(span: trace.Span, exit_code: int) -> None:
    """Mark the command's span failed when it exits non-zero (errors the CLI reports
    and turns into an exit code raise nothing)."""
    if exit_code:
        span.set_status(Status(StatusCode.ERROR, f"exit code {exit_code}"))


def command_words(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The subcommand path of `argv` (`["token", "create"]`), without ids or options."""
    words: list[str] = []
    level = parser
    for token in argv:
        subs = [a for a in level._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if token in subs[0].choices:
            words.append(token)
            level = subs[0].choices[token]
    return words
