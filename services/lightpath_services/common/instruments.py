"""The services' metrics, recorded straight into prometheus_client: one path per metric.

Every metric is listed once in lightpath_services.common.metric_names (its OpenTelemetry-style
name, kind, unit and labels); `get_meter` gives a meter with the OpenTelemetry metrics
API's shape (`create_counter(...).add(1, {"outcome": "ok"})`, observable gauges read by
a callback) whose instruments are prometheus_client's own Counter, Gauge and Histogram
under the metric's Prometheus name (`MetricName.prometheus`). prometheus_client does the
naming of samples, the locking and the exposition that `serve_metrics` serves; an
attribute set costs one `labels()` lookup per record. OpenTelemetry is for traces only.

Records count once `configure_metrics(prometheus=True)` has run in the process (a
service with LIGHTPATH_METRICS_LISTEN); before that, and in processes that serve no
metrics, they are dropped at the first line, and observable instruments are not
registered. A meter given its own registry (a test's) always records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from json import dumps
from typing import Any
from weakref import WeakKeyDictionary

from opentelemetry.metrics import (
    CallbackOptions,
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
from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lightpath import __version__
from lightpath.telemetry import SECONDS_BUCKETS, metrics_enabled
from lightpath_services.common.metric_names import BY_OTEL, MetricName

__all__ = ["DEFAULT_BOUNDS", "PrometheusMeter", "get_meter"]

disable_created_metrics()  # no `_created` series: the dashboards and rules never read them

# Histogram boundaries for a unit other than seconds (rpc.server.duration, in ms): the
# OpenTelemetry SDK's defaults, which the dashboards' queries were written against.
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

# registry -> name -> its prometheus_client metric (made once: a metric made again is it)
_made: WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = WeakKeyDictionary()
_made_lock = threading.Lock()
_CHILDREN_CACHED = 8000  # attribute sets remembered per instrument (a small fixed set in practice)


def get_meter(name: str, version: str = __version__) -> PrometheusMeter:
    """The meter a service's instruments come from (the process's default registry)."""
    return PrometheusMeter(name, version)


def _label_names(m: MetricName) -> list[str]:
    return [k.replace(".", "_") for k in m.labels]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value, default=str)


class _Instrument:
    """One listed metric on a registry: `child(attributes)` is the prometheus_client
    child of that attribute set (a missing attribute is an empty label)."""

    def __init__(self, meter: PrometheusMeter, name: str, make: Callable[..., Any]):
        self._listed = BY_OTEL[name]  # KeyError: list it in lightpath_services.common.metric_names
        self._keys = self._listed.labels
        self._on = meter.recording
        with _made_lock:
            made = _made.setdefault(meter.registry, {})
            metric = made.get(self._listed.prometheus)
            if metric is None:
                metric = made[self._listed.prometheus] = make(
                    self._listed.prometheus,
                    self._listed.description,
                    _label_names(self._listed),
                    registry=meter.registry,
                )
        self._metric = metric
        # attributes as given -> child: prometheus_client's labels() checks and builds its
        # key on every call (~10 us); a dict lookup here is the record path's only cost.
        self._children: dict[Any, Any] = {}

    def child(self, attributes: Attributes) -> Any:
        if not self._keys:
            return self._metric
        try:
            key: Any = tuple(attributes.items()) if attributes else ()
            found = self._children.get(key)
        except TypeError:  # an unhashable value (a list): not cached
            key, found = None, None
        if found is None:
            given = attributes or {}
            found = self._metric.labels(*[_text(given.get(k, "")) for k in self._keys])
            if key is not None and len(self._children) < _CHILDREN_CACHED:
                self._children[key] = found
        return found


class _Counter(_Instrument, Counter):
    def add(self, amount: int | float, attributes: Attributes = None, context: Any = None) -> None:
        if self._on() and amount >= 0:  # a counter only goes up
            self.child(attributes).inc(amount)


class _UpDownCounter(_Instrument, UpDownCounter):
    def add(self, amount: int | float, attributes: Attributes = None, context: Any = None) -> None:
        if self._on():
            self.child(attributes).inc(amount)


class _Gauge(_Instrument, Gauge):
    def set(self, amount: int | float, attributes: Attributes = None, context: Any = None) -> None:
        if self._on():
            self.child(attributes).set(amount)


class _Histogram(_Instrument, Histogram):
    def record(
        self, amount: int | float, attributes: Attributes = None, context: Any = None
    ) -> None:
        if self._on() and amount >= 0:
            self.child(attributes).observe(amount)

    def bind(self, attributes: Attributes) -> Callable[[float], None]:
        """A recorder of one attribute set, for the hottest paths (a Redis command)."""
        observe = self.child(attributes).observe
        on = self._on

        def record(amount: float) -> None:
            if on():
                observe(amount)

        return record


class _Observed:
    """An observable instrument: a collector on the registry that calls its callbacks
    at each scrape and shows their observations."""

    def __init__(self, name: str, callbacks: Sequence[CallbackT] | None, counter: bool):
        self._listed = BY_OTEL[name]
        self._callbacks = list(callbacks or ())
        self._counter = counter

    def describe(self) -> Iterable[Any]:
        return ()  # collected at scrape time only

    def collect(self) -> Iterable[Any]:
        m = self._listed
        family = (CounterMetricFamily if self._counter else GaugeMetricFamily)(
            m.prometheus, m.description, labels=_label_names(m)
        )
        for callback in self._callbacks:
            for obs in callback(CallbackOptions()):  # type: ignore[operator]
                given = obs.attributes or {}
                family.add_metric([_text(given.get(k, "")) for k in m.labels], obs.value)
        yield family


class _ObservableGauge(ObservableGauge, ObservableCounter, ObservableUpDownCounter):
    """What create_observable_* return: nothing to call (the callbacks do the work)."""

    def __init__(self, name: str, unit: str = "", description: str = "") -> None:
        pass


class PrometheusMeter(Meter):
    """A meter whose instruments are prometheus_client metrics on `registry` (the
    process's default one: recorded once `configure_metrics(prometheus=True)` ran;
    another: always)."""

    def __init__(
        self,
        name: str = "lightpath",
        version: str = __version__,
        registry: CollectorRegistry | None = None,
    ):
        super().__init__(name, version)
        self.registry = registry or REGISTRY
        self.recording: Callable[[], bool] = metrics_enabled if registry is None else (lambda: True)

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        return _Counter(self, name, PromCounter)

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> UpDownCounter:
        return _UpDownCounter(self, name, PromGauge)

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Gauge:  # type: ignore[override]
        return _Gauge(self, name, PromGauge)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> _Histogram:
        bounds = (
            SECONDS_BUCKETS
            if unit == "s"
            else tuple(explicit_bucket_boundaries_advisory or DEFAULT_BOUNDS)
        )

        def make(name: str, documentation: str, labels: list[str], **kw: Any) -> PromHistogram:
            return PromHistogram(name, documentation, labels, buckets=bounds, **kw)

        return _Histogram(self, name, make)

    def _observe(
        self, name: str, callbacks: Sequence[CallbackT] | None, *, counter: bool = False
    ) -> _ObservableGauge:
        if self.recording():
            self.registry.register(_Observed(name, callbacks, counter))  # type: ignore[arg-type]
        else:
            BY_OTEL[name]
        return _ObservableGauge(name)

    def create_observable_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableCounter:
        return self._observe(name, callbacks, counter=True)

    def create_observable_gauge(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableGauge:
        return self._observe(name, callbacks)

    def create_observable_up_down_counter(
        self,
        name: str,
        callbacks: Sequence[CallbackT] | None = None,
        unit: str = "",
        description: str = "",
    ) -> ObservableUpDownCounter:
        return self._observe(name, callbacks)
