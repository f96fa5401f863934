"""services.common.instruments (issue 18): the cheap synchronous instruments a service
uses when its metrics go only to its Prometheus endpoint show exactly what the OTel
SDK and opentelemetry-exporter-prometheus would show for the same records, so the
dashboards, alert rules and tests written against that exporter hold either way."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lightpath import telemetry
from lightpath.telemetry import SECONDS_BUCKETS
from services.common import instruments, metric_names
from services.common.instruments import CARDINALITY_LIMIT, Collector, PrometheusMeter
from services.common.metric_names import COUNTER, HISTOGRAM


def _pair() -> tuple[Meter, PrometheusMeter, CollectorRegistry, CollectorRegistry, MeterProvider]:
    """An SDK meter exported by opentelemetry-exporter-prometheus (with the histogram view
    configure_metrics installs) and a PrometheusMeter, each on a registry of its own."""
    otel_registry, fast_registry = CollectorRegistry(), CollectorRegistry()
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(registry=otel_registry)],
        views=[
            View(
                instrument_type=Histogram,
                instrument_unit="s",
                aggregation=ExplicitBucketHistogramAggregation(list(SECONDS_BUCKETS)),
            )
        ],
    )
    otel = provider.get_meter("lightpath.test", "1.2.3")
    fast = PrometheusMeter(otel, Collector(fast_registry))
    return otel, fast, otel_registry, fast_registry, provider


def _lines(registry: CollectorRegistry) -> list[str]:
    """The exposition's lines, sorted, without target_info (only the SDK's reader has it)."""
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines() if "target_info" not in line)


def _record(meter: Meter, m: metric_names.MetricName, value: float, attrs: dict) -> None:
    if m.kind == COUNTER:
        meter.create_counter(m.otel, unit=m.unit, description=m.description).add(value, attrs)
    elif m.kind == HISTOGRAM:
        meter.create_histogram(m.otel, unit=m.unit, description=m.description).record(value, attrs)
    else:
        meter.create_gauge(m.otel, unit=m.unit, description=m.description).set(value, attrs)


def test_every_listed_metric_shows_as_the_sdk_and_its_exporter_show_it():
    """Each instrument of services.common.metric_names, recorded alike both ways (bucket
    edges, zero, several attribute sets): the same lines, byte for byte."""
    otel, fast, otel_registry, fast_registry, provider = _pair()
    values = (0.0, 0.00005, 0.0001, 0.003, 5.0, 7.5, 10000.0, 20000.0)
    for m in metric_names.ALL:
        for meter in (otel, fast):
            for i, v in enumerate(values):
                _record(meter, m, v, {label: f"v{i % 3}" for label in m.labels})
    assert _lines(fast_registry) == _lines(otel_registry)
    assert any(
        line.startswith("rpc_server_duration_milliseconds_bucket") for line in _lines(fast_registry)
    )
    provider.shutdown()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([m for m in metric_names.ALL if m.kind in (COUNTER, HISTOGRAM)]),
            st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
            st.sampled_from(["a", "b", "pod-1"]),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_any_records_show_as_the_sdk_shows_them(records):
    """Counters and histograms, any values, attribute sets given in either key order."""
    otel, fast, otel_registry, fast_registry, provider = _pair()
    for m, value, label_value, reverse in records:
        attrs = {label: label_value for label in m.labels}
        if reverse:  # the same set, its keys in the other order: one series, not two
            attrs = dict(reversed(list(attrs.items())))
        for meter in (otel, fast):
            _record(meter, m, value, attrs)
    assert _lines(fast_registry) == _lines(otel_registry)
    provider.shutdown()


def test_beyond_the_cardinality_limit_new_attribute_sets_go_to_the_overflow_series():
    otel, fast, otel_registry, fast_registry, provider = _pair()
    for meter in (otel, fast):
        counter = meter.create_counter("lightpath.test.things")
        for i in range(CARDINALITY_LIMIT + 5):
            counter.add(1, {"job": str(i)})
        counter.add(1, {"job": "0"})  # a set seen before the limit keeps its own series
    lines = _lines(fast_registry)
    assert lines == _lines(otel_registry)
    assert any('otel_metric_overflow="true"' in line and line.endswith(" 5.0") for line in lines)
    provider.shutdown()


def test_records_from_many_threads_are_all_counted():
    _otel, fast, _o, fast_registry, provider = _pair()
    counter = fast.create_counter("lightpath.test.things")
    histogram = fast.create_histogram("lightpath.test.duration", unit="s")
    bound = histogram.bind({"kind": "bound"})

    def work(n: int) -> None:
        for _ in range(2000):
            counter.add(1, {"thread": str(n % 2)})
            histogram.record(0.001, {"kind": "free"})
            bound(0.001)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = {
        (s.name, s.labels.get("thread") or s.labels.get("kind")): s.value
        for family in text_string_to_metric_families(generate_latest(fast_registry).decode())
        for s in family.samples
    }
    assert found[("lightpath_test_things_total", "0")] == 4000
    assert found[("lightpath_test_things_total", "1")] == 4000
    for kind in ("bound", "free"):
        assert found[("lightpath_test_duration_seconds_count", kind)] == 8000
        assert abs(found[("lightpath_test_duration_seconds_sum", kind)] - 8.0) < 1e-9
    provider.shutdown()


def test_the_same_instrument_made_twice_is_one_series_as_in_the_sdk():
    otel, fast, otel_registry, fast_registry, provider = _pair()
    for meter in (otel, fast):
        meter.create_counter("lightpath.test.things").add(2, {"pod": "p"})
        meter.create_counter("lightpath.test.things").add(3, {"pod": "p"})
    assert _lines(fast_registry) == _lines(otel_registry)
    assert any(line.endswith(" 5.0") for line in _lines(fast_registry) if "things_total" in line)
    provider.shutdown()


def test_negative_or_non_finite_amounts_are_dropped_as_the_sdk_drops_them():
    otel, fast, otel_registry, fast_registry, provider = _pair()
    for meter in (otel, fast):
        counter = meter.create_counter("lightpath.test.things")
        histogram = meter.create_histogram("lightpath.test.duration", unit="s")
        for bad in (-1.0, float("nan"), float("inf")):
            histogram.record(bad, {"k": "v"})
        counter.add(-1, {"k": "v"})
        counter.add(1, {"k": "v"})
        histogram.record(0.5, {"k": "v"})
    assert _lines(fast_registry) == _lines(otel_registry)
    provider.shutdown()


def test_get_meter_is_the_cheap_one_only_when_prometheus_is_the_only_exporter(monkeypatch):
    """With an OTel exporter (OTLP, console) every instrument stays the SDK's, so OTLP
    users get them all; observable gauges are always the SDK's (read at scrape time)."""
    monkeypatch.setattr(telemetry, "_PROMETHEUS_ONLY", False)
    assert not isinstance(instruments.get_meter("lightpath.test"), PrometheusMeter)
    monkeypatch.setattr(telemetry, "_PROMETHEUS_ONLY", True)
    meter = instruments.get_meter("lightpath.test")
    assert isinstance(meter, PrometheusMeter)
    gauge = meter.create_observable_gauge("lightpath.test.level", [lambda _o: []])
    assert type(gauge).__module__.startswith("opentelemetry")
