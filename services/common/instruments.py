"""Synchronous instruments that cost next to nothing on the request path (issue 18).

A service's counters and histograms are recorded on every request (rpc.server.duration
on each RPC; admissions, wirings, forwards, decisions...). Through the OpenTelemetry
SDK one record costs ~10 µs (attributes cleaned and hashed, a Measurement built, an
exemplar offered) and, with several per request in each process, that was most of what
the metrics added to the workload_scheduler and cell benchmarks (bench/metrics_cost.py:
the same load with the records made ten times over cost ten times as much more).

When a process's metrics go only to its Prometheus endpoint (`configure_metrics` with
`prometheus` and no OTel exporter: the local stack, compose and Kubernetes),
`get_meter` gives a meter whose synchronous instruments keep their values here, a
dict lookup and a bucket increment (~0.3 µs a record), and this module's collector
shows them on the endpoint exactly as opentelemetry-exporter-prometheus would (same
family names, units, `_total`, buckets, `otel_scope_*` labels, the SDK's default
histogram boundaries or SECONDS_BUCKETS for unit `s`, the same 2,000 attribute sets
per instrument and overflow series). Observable instruments (read at scrape time)
stay OpenTelemetry's. With an OTel exporter (OTLP or console) configured, `get_meter`
is OpenTelemetry's meter and everything goes through the SDK as before, so OTLP users
get every instrument. The two Redis command metrics are always kept here (they are on
the Prometheus endpoint only: services.common.redis_store).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from json import dumps
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import (
    CallbackT,
    Counter,
    Histogram,
    Meter,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.metrics import _Gauge as Gauge
from opentelemetry.util.types import Attributes

from lightpath import __version__
from lightpath.telemetry import SECONDS_BUCKETS, prometheus_only

__all__ = ["COLLECTOR", "Collector", "FastHistogram", "PrometheusMeter", "get_meter"]

# The OpenTelemetry SDK's default histogram boundaries (ExplicitBucketHistogramAggregation),
# which configure_metrics keeps for every histogram whose unit is not `s`.
DEFAULT_BOUNDS: tuple[float, ...] = (
    0.0,
    5.0,
    10.0,
    25.0,
    50.0,
    75.0,
    100.0,
    250.0,
    500.0,
    750.0,
    1000.0,
    2500.0,
    5000.0,
    7500.0,
    10000.0,
)
CARDINALITY_LIMIT = 2000  # attribute sets per instrument, as the SDK's default
_OVERFLOW = (("otel.metric.overflow", True),)
_INF = math.inf

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


def get_meter(name: str, version: str = __version__) -> Meter:
    """The meter a service's instruments come from: this module's (cheap) one when the
    process's metrics go only to its Prometheus endpoint, else OpenTelemetry's."""
    otel = metrics.get_meter(name, version)
    return PrometheusMeter(otel) if prometheus_only() else otel


class _Stream:
    """One instrument's points by attribute set. A counter's or gauge's point is
    [value]; a histogram's is [sum, count in bucket 0, 1, ..., +Inf]."""

    __slots__ = ("bounds", "description", "kind", "lock", "name", "points", "raw", "scope", "unit")

    def __init__(
        self,
        kind: str,
        name: str,
        unit: str,
        description: str,
        scope: tuple[str, str],
        bounds: Sequence[float] = (),
    ):
        self.kind = kind
        self.name = name
        self.unit = unit
        self.description = description
        self.scope = scope
        self.bounds = tuple(bounds)
        self.lock = threading.Lock()
        self.points: dict[tuple, list[float]] = {}  # sorted attributes -> point
        self.raw: dict[Any, list[float]] = {}  # attributes as given -> the same point

    def point(self, attributes: Attributes) -> list[float]:
        """The point of `attributes` (made on first use): the record path's one lookup."""
        key: Any = tuple(attributes.items()) if attributes else ()
        try:
            found = self.raw.get(key)
        except TypeError:  # an unhashable value (a list): keyed by its text
            key = tuple((k, dumps(v, default=str)) for k, v in attributes.items())  # type: ignore[union-attr]
            found = self.raw.get(key)
        if found is not None:
            return found
        with self.lock:
            canonical = tuple(sorted(key))
            found = self.points.get(canonical)
            if found is None:
                if len(self.points) >= CARDINALITY_LIMIT:
                    canonical = _OVERFLOW
                    found = self.points.get(canonical)
                if found is None:
                    found = [0.0] * (len(self.bounds) + 2) if self.kind == HISTOGRAM else [0.0]
                    self.points[canonical] = found
            if len(self.raw) < 4 * CARDINALITY_LIMIT:
                self.raw[key] = found
            return found

    def snapshot(self) -> list[tuple[tuple, list[float]]]:
        with self.lock:
            return [(k, list(p)) for k, p in self.points.items()]


class _Counter(Counter):
    def __init__(self, stream: _Stream):
        self._stream = stream

    def add(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        if not 0 <= amount < _INF:
            return  # a counter only goes up (the SDK drops such an amount too)
        point = self._stream.point(attributes)
        with self._stream.lock:
            point[0] += amount


class _UpDownCounter(UpDownCounter):
    def __init__(self, stream: _Stream):
        self._stream = stream

    def add(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        point = self._stream.point(attributes)
        with self._stream.lock:
            point[0] += amount


class _Gauge(Gauge):
    def __init__(self, stream: _Stream):
        self._stream = stream

    def set(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._stream.point(attributes)[0] = amount


class FastHistogram(Histogram):
    def __init__(self, stream: _Stream):
        self._stream = stream
        self._bounds = stream.bounds

    def record(
        self, amount: int | float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        if not 0 <= amount < _INF:
            return  # negative, NaN or infinite: dropped, as the SDK does
        point = self._stream.point(attributes)
        index = bisect.bisect_left(self._bounds, amount) + 1  # upper bounds are inclusive
        with self._stream.lock:
            point[0] += amount
            point[index] += 1

    def bind(self, attributes: Attributes) -> Callable[[float], None]:
        """A recorder of one attribute set, for the hottest paths (a Redis command)."""
        stream = self._stream
        point = stream.point(attributes)
        bounds = self._bounds
        lock = stream.lock
        locate = bisect.bisect_left

        def record(amount: float) -> None:
            if not 0 <= amount < _INF:
                return
            index = locate(bounds, amount) + 1
            with lock:
                point[0] += amount
                point[index] += 1

        return record


class Collector:
    """prometheus_client's view of streams: `COLLECTOR` holds every stream of this
    process and registers in prometheus_client's default registry, which
    `serve_metrics` serves (a test can give its own `registry`)."""

    def __init__(self, registry: Any = None) -> None:
        self._streams: dict[tuple[str, str, str], _Stream] = {}
        self._lock = threading.Lock()
        self._registry = registry
        self._registered = False

    def stream(
        self,
        kind: str,
        scope: tuple[str, str],
        name: str,
        unit: str,
        description: str,
        bounds: Sequence[float] = (),
    ) -> _Stream:
        """The stream of instrument `name` of meter `scope` (the same one when it is
        made again, as the SDK does)."""
        with self._lock:
            if not self._registered:
                from prometheus_client import REGISTRY

                (self._registry or REGISTRY).register(self)
                self._registered = True
            key = (scope[0], scope[1], name)
            found = self._streams.get(key)
            if found is None or found.kind != kind:
                found = self._streams[key] = _Stream(kind, name, unit, description, scope, bounds)
            return found

    def describe(self) -> Iterable[Any]:
        """Nothing: the registry need not collect (and so lock) to register this collector."""
        return ()

    def collect(self) -> Iterable[Any]:
        from opentelemetry.exporter.prometheus._mapping import (
            map_unit,
            sanitize_attribute,
            sanitize_full_name,
        )
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:
            streams = list(self._streams.values())
        families: dict[tuple[str, str, str, str], Any] = {}
        rows: dict[tuple[str, str, str, str], list[tuple[dict[str, str], list[float]]]] = {}
        for s in streams:
            fid = (sanitize_full_name(s.name), s.description, map_unit(s.unit), s.kind)
            scope = {
                "otel_scope_name": s.scope[0],
                "otel_scope_version": s.scope[1],
                "otel_scope_schema_url": "",
            }
            for attributes, point in s.snapshot():
                labels = dict(scope)
                for k, v in attributes:
                    labels[sanitize_attribute(k)] = (
                        v if isinstance(v, str) else dumps(v, default=str)
                    )
                rows.setdefault(fid, []).append((labels, point))
            families.setdefault(fid, s)
        for fid, points in rows.items():
            name, description, unit, kind = fid
            keys = sorted({k for labels, _ in points for k in labels})
            factory = {
                COUNTER: CounterMetricFamily,
                GAUGE: GaugeMetricFamily,
                HISTOGRAM: HistogramMetricFamily,
            }[kind]
            family = factory(name=name, documentation=description, labels=keys, unit=unit)
            bounds = families[fid].bounds
            for labels, point in points:
                values = [labels.get(k, "") for k in keys]
                if kind == HISTOGRAM:
                    family.add_metric(values, buckets=_buckets(point, bounds), sum_value=point[0])
                else:
                    family.add_metric(values, point[0])
            yield family


def _buckets(point: list[float], bounds: Sequence[float]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, as opentelemetry-exporter-prometheus writes them."""
    out = []
    total = 0.0
    for upper, count in zip([*bounds, "+Inf"], point[1:], strict=True):
        total += count
        out.append((f"{upper}", total))
    return out


COLLECTOR = Collector()


class PrometheusMeter(Meter):
    """A meter whose synchronous instruments are this module's; observable ones are
    the wrapped OpenTelemetry meter's (they are read at scrape time only)."""

    def __init__(self, otel: Meter, collector: Collector | None = None):
        super().__init__(otel.name, otel.version, otel.schema_url)
        self._otel = otel
        self._scope = (otel.name, otel.version or "")
        self._collector = collector or COLLECTOR

    def _stream(self, kind: str, name: str, unit: str, description: str, bounds=()) -> _Stream:
        return self._collector.stream(kind, self._scope, name, unit, description, bounds)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return _Counter(self._stream(COUNTER, name, unit, description))

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        return _UpDownCounter(self._stream(GAUGE, name, unit, description))

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Gauge:  # type: ignore[override]
        return _Gauge(self._stream(GAUGE, name, unit, description))

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> FastHistogram:
        # configure_metrics's view (unit s) wins over an advisory, as in the SDK
        bounds = (
            SECONDS_BUCKETS
            if unit == "s"
            else tuple(explicit_bucket_boundaries_advisory or DEFAULT_BOUNDS)
        )
        return FastHistogram(self._stream(HISTOGRAM, name, unit, description, bounds))

    def create_observable_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableCounter:
        return self._otel.create_observable_counter(name, callbacks, unit, description)

    def create_observable_gauge(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableGauge:
        return self._otel.create_observable_gauge(name, callbacks, unit, description)

    def create_observable_up_down_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableUpDownCounter:
        return self._otel.create_observable_up_down_counter(name, callbacks, unit, description)
