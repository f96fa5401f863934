"""lightpath_services.common.instruments: the services' metrics straight into prometheus_client, one
path per metric, by the names and labels lightpath_services.common.metric_names lists."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.metrics import Observation
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lightpath import telemetry
from lightpath_services.common import instruments
from lightpath_services.common.instruments import PrometheusMeter


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def test_an_instrument_made_twice_is_one_metric_counting_both():
    registry = CollectorRegistry()
    a = PrometheusMeter("a", registry=registry).create_counter("lightpath.cell.forwards")
    b = PrometheusMeter("b", registry=registry).create_counter("lightpath.cell.forwards")
    a.add(2, {"result": "ok"})
    b.add(3, {"result": "ok"})
    assert _samples(registry)[("lightpath_cell_forwards_total", (("result", "ok"),))] == 5


def test_attributes_are_labels_under_their_prometheus_names_and_missing_ones_are_empty():
    registry = CollectorRegistry()
    meter = PrometheusMeter("t", registry=registry)
    duration = meter.create_histogram("rpc.server.duration", unit="ms")
    duration.record(7.0, {"rpc.method": "/x.Y/Z", "rpc.grpc.status_code": "OK"})
    duration.record(1.0, {"rpc.method": "/x.Y/Z"})
    found = _samples(registry)
    ok = (("rpc_grpc_status_code", "OK"), ("rpc_method", "/x.Y/Z"))
    assert found[("rpc_server_duration_milliseconds_count", ok)] == 1
    assert found[("rpc_server_duration_milliseconds_sum", ok)] == 7.0
    # the SDK's default boundaries for a unit other than seconds: 7 ms is in (5, 10]
    bucket = "rpc_server_duration_milliseconds_bucket"
    assert found[(bucket, tuple(sorted((*ok, ("le", "5.0")))))] == 0
    assert found[(bucket, tuple(sorted((*ok, ("le", "10.0")))))] == 1
    none = (("rpc_grpc_status_code", ""), ("rpc_method", "/x.Y/Z"))
    assert found[("rpc_server_duration_milliseconds_count", none)] == 1


def test_seconds_histograms_get_the_seconds_buckets_and_bind_records_one_attribute_set():
    registry = CollectorRegistry()
    meter = PrometheusMeter("t", registry=registry)
    record = meter.create_histogram("lightpath.redis.command.duration", unit="s").bind(
        {"command": "GET"}
    )
    record(0.0003)
    found = _samples(registry)
    get = (("command", "GET"),)
    name = "lightpath_redis_command_duration_seconds_bucket"
    assert found[(name, (*get, ("le", "0.00025")))] == 0
    assert found[(name, (*get, ("le", "0.0005")))] == 1


def test_negative_amounts_are_dropped_where_a_metric_only_goes_up():
    registry = CollectorRegistry()
    meter = PrometheusMeter("t", registry=registry)
    meter.create_counter("lightpath.cell.requeues").add(-1, {"reason": "x"})
    meter.create_histogram("lightpath.cell.submit_to_running.duration", unit="s").record(-2)
    depth = meter.create_up_down_counter("lightpath.cell.queue.depth")
    depth.add(3)
    depth.add(-1)
    found = _samples(registry)
    assert ("lightpath_cell_requeues_total", (("reason", "x"),)) not in found
    assert found[("lightpath_cell_submit_to_running_duration_seconds_count", ())] == 0
    assert found[("lightpath_cell_queue_depth", ())] == 2


def test_observable_gauges_are_read_at_each_scrape():
    registry = CollectorRegistry()
    ages = {"pod-1": 2.5}
    PrometheusMeter("t", registry=registry).create_observable_gauge(
        "lightpath.cell.heartbeat.age",
        [lambda _o: [Observation(v, {"pod": p}) for p, v in ages.items()]],
        unit="s",
    )
    assert _samples(registry)[("lightpath_cell_heartbeat_age_seconds", (("pod", "pod-1"),))] == 2.5
    ages["pod-1"] = 4.0
    assert _samples(registry)[("lightpath_cell_heartbeat_age_seconds", (("pod", "pod-1"),))] == 4.0


def test_records_from_many_threads_are_all_counted():
    registry = CollectorRegistry()
    counter = PrometheusMeter("t", registry=registry).create_counter("lightpath.task.restarts")

    def work() -> None:
        for _ in range(2000):
            counter.add(1, {"task": "x"})

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _samples(registry)[("lightpath_task_restarts_total", (("task", "x"),))] == 16000


def test_a_metric_not_in_the_list_cannot_be_made():
    with pytest.raises(KeyError):
        PrometheusMeter("t", registry=CollectorRegistry()).create_counter("lightpath.unlisted")


def test_the_process_registry_records_only_once_the_process_serves_metrics(monkeypatch):
    """A process without LIGHTPATH_METRICS_LISTEN pays one check per record and shows
    nothing; once configure_metrics(prometheus=True) ran, the same instrument counts."""
    counter = instruments.get_meter("lightpath.test").create_counter("lightpath.auth.failures")

    def failures() -> float:
        return REGISTRY.get_sample_value("lightpath_auth_failures_total", {"reason": "t1"}) or 0

    monkeypatch.setattr(telemetry, "_METRICS", False)
    counter.add(1, {"reason": "t1"})
    assert failures() == 0
    monkeypatch.setattr(telemetry, "_METRICS", True)
    counter.add(1, {"reason": "t1"})
    assert failures() == 1
