"""Reading a service's OTel metrics in a test (issue 18): its `build` given a recorder
on the test's own MeterProvider with an in-memory reader, and helpers over what that
reader collects."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from services.common.metric_names import BY_OTEL


def install(
    monkeypatch: Any, server: ModuleType, recorder: Callable[..., Any], refresh_s: float
) -> InMemoryMetricReader:
    """Make `server.build` (what tests.helpers.serve starts) record through
    `recorder(meter, refresh_s=...)` on a provider of the test's own; its reader."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    monkeypatch.setattr(
        server,
        "build",
        functools.partial(server.build, metrics=recorder(meter, refresh_s=refresh_s)),
    )
    return reader


def _metrics(reader: InMemoryMetricReader):
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            yield from sm.metrics


def assert_listed(reader: InMemoryMetricReader) -> None:
    """Every point collected is of an instrument services.common.metric_names lists,
    with exactly its attributes (the dashboards and alert rules are written against it)."""
    for m in _metrics(reader):
        listed = BY_OTEL[m.name]
        for p in m.data.data_points:
            assert sorted(p.attributes) == sorted(listed.labels), (m.name, p.attributes)


def points(reader: InMemoryMetricReader, name: str) -> list:
    """The data points of instrument `name` collected now."""
    return [p for m in _metrics(reader) if m.name == name for p in m.data.data_points]


def value(reader: InMemoryMetricReader, name: str, **attrs: Any) -> float:
    """The sum of the points of `name` whose attributes include `attrs` (a histogram: its count)."""
    return sum(
        p.count if hasattr(p, "bucket_counts") else p.value
        for p in points(reader, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


async def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
