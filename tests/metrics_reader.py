"""Reading a service's metrics in a test (issue 18): its `build` given a recorder on a
meter of the test's own prometheus_client registry, and helpers over what a scrape of
that registry shows, by the metrics' listed (OpenTelemetry-style) names and attributes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from lightpath_services.common.instruments import PrometheusMeter
from lightpath_services.common.metric_names import BY_OTEL, HISTOGRAM, MetricName


def install(
    monkeypatch: Any, server: ModuleType, recorder: Callable[..., Any], refresh_s: float
) -> CollectorRegistry:
    """Make `server.build` (what tests.helpers.serve starts) record through
    `recorder(meter, refresh_s=...)` on a registry of the test's own; the registry."""
    registry = CollectorRegistry()
    meter = PrometheusMeter("test", registry=registry)
    monkeypatch.setattr(
        server,
        "build",
        functools.partial(server.build, metrics=recorder(meter, refresh_s=refresh_s)),
    )
    return registry


def _points(registry: CollectorRegistry, m: MetricName) -> list[SimpleNamespace]:
    """One point per attribute set of `m` (attributes by their listed keys): `value`, or a
    histogram's `count` and `sum`."""
    keys = {k.replace(".", "_"): k for k in m.labels}
    out: dict[tuple, SimpleNamespace] = {}
    for family in registry.collect():
        if family.name != m.prometheus:
            continue
        for sample in family.samples:
            attributes = {keys[k]: v for k, v in sample.labels.items() if k in keys}
            point = out.setdefault(
                tuple(sorted(attributes.items())), SimpleNamespace(attributes=attributes)
            )
            if sample.name.endswith("_count"):
                point.count = sample.value
            elif sample.name.endswith("_sum"):
                point.sum = sample.value
            elif not sample.name.endswith(("_bucket", "_created")):
                point.value = sample.value
    return list(out.values())


def assert_listed(registry: CollectorRegistry) -> None:
    """Every point shown is of a metric lightpath_services.common.metric_names lists, with exactly
    its attributes (the dashboards and alert rules are written against it)."""
    listed = {m.prometheus: m for m in BY_OTEL.values()}
    for family in registry.collect():
        m = listed[family.name]
        names = sorted(k.replace(".", "_") for k in m.labels)
        for sample in family.samples:
            assert sorted(set(sample.labels) - {"le"}) == names, (m.otel, sample.labels)


def points(registry: CollectorRegistry, name: str) -> list:
    """The points of metric `name` shown now."""
    return _points(registry, BY_OTEL[name])


def value(registry: CollectorRegistry, name: str, **attrs: Any) -> float:
    """The sum of the points of `name` whose attributes include `attrs` (a histogram: its count)."""
    histogram = BY_OTEL[name].kind == HISTOGRAM
    return sum(
        p.count if histogram else p.value
        for p in points(registry, name)
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    )


async def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
