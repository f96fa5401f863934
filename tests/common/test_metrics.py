"""Metrics (issue 18): the Prometheus names of lightpath_services.common.metric_names are the ones
the exporter really produces, a service's scrape endpoint serves the common metrics
and they move (an RPC, a refused call, Redis commands and errors, a background task
restarting), and the console exporters stay out of the log stream."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis as sync_redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lightpath.telemetry import configure_metrics, configure_tracing
from lightpath.v1 import common_pb2, core_broker_pb2, core_broker_pb2_grpc
from lightpath_services.common import metric_names, redis_store
from lightpath_services.common.instruments import PrometheusMeter
from lightpath_services.common.metric_names import COUNTER, GAUGE, HISTOGRAM
from lightpath_services.common.settings import CommonSettings, SettingsError, load
from tests.metrics_probe import FAIL_KEY, TASK

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    """The sum over the series named `name` whose labels include `labels` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= ls)


# -- the names ----------------------------------------------------------------------


def test_every_metric_name_is_what_the_prometheus_exporter_shows():
    """Each instrument of the list, made as the list says and recorded once, appears on a
    scrape under exactly the sample names `MetricName.series` gives, with its labels."""
    registry = CollectorRegistry()
    meter = PrometheusMeter("lightpath.test", registry=registry)
    for m in metric_names.ALL:
        attrs = {label: "x" for label in m.labels}
        if m.kind == COUNTER:
            meter.create_counter(m.otel, unit=m.unit).add(1, attrs)
        elif m.kind == HISTOGRAM:
            meter.create_histogram(m.otel, unit=m.unit).record(0.5, attrs)
        else:
            assert m.kind == GAUGE
            meter.create_gauge(m.otel, unit=m.unit).set(1, attrs)
    found = samples(generate_latest(registry).decode())
    names = {n for n, _ in found}
    for m in metric_names.ALL:
        for series in m.series:
            assert series in names, f"{m.otel} is not exported as {series}: {sorted(names)}"
            (labels,) = {ls for n, ls in found if n == series and ("le", "+Inf") in ls} or {
                ls for n, ls in found if n == series
            }
            keys = {k for k, _ in labels} - {"le"}
            assert keys == {label.replace(".", "_") for label in m.labels}, m.otel
    assert not {n for n in names if n.endswith("_created")}  # never read: not made


def test_an_up_down_counter_or_observable_gauge_exports_as_a_gauge_under_the_bare_name():
    registry = CollectorRegistry()
    meter = PrometheusMeter("lightpath.test", registry=registry)
    meter.create_up_down_counter("lightpath.cell.queue.depth").add(3)
    from opentelemetry.metrics import Observation

    meter.create_observable_gauge(
        "lightpath.cell.heartbeat.age", [lambda _o: [Observation(2.5, {"pod": "pod-1"})]], unit="s"
    )
    families = {
        f.name: f.type for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert families["lightpath_cell_queue_depth"] == "gauge"
    assert families["lightpath_cell_heartbeat_age_seconds"] == "gauge"


def test_names_are_unique_and_prefixed():
    otel = [m.otel for m in metric_names.ALL]
    assert len(otel) == len(set(otel))
    for m in metric_names.ALL:
        assert m.otel.startswith("lightpath.") or m.otel == "rpc.server.duration"
        assert m.kind in (COUNTER, GAUGE, HISTOGRAM)
    assert metric_names.prometheus_name("lightpath.redis.command.duration", "s") == (
        "lightpath_redis_command_duration_seconds"
    )
    assert metric_names.prometheus_name("rpc.server.duration", "ms") == (
        "rpc_server_duration_milliseconds"
    )
    assert metric_names.BY_OTEL["lightpath.agg.bytes_aggregated"].series == (
        "lightpath_agg_bytes_aggregated_bytes_total",
    )


# -- the setting --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, parsed",
    [
        ("", ""),
        ("9464", "127.0.0.1:9464"),
        ("0.0.0.0:9464", "0.0.0.0:9464"),
        ("[::1]:0", "[::1]:0"),
    ],
)
def test_metrics_listen_is_off_unless_set_and_loopback_for_a_bare_port(raw, parsed):
    env = {"LIGHTPATH_METRICS_LISTEN": raw} if raw else {}
    assert load(CommonSettings, env).metrics_listen == parsed


def test_a_bad_metrics_listen_stops_the_service_naming_the_variable():
    with pytest.raises(SettingsError, match="LIGHTPATH_METRICS_LISTEN"):
        load(CommonSettings, {"LIGHTPATH_METRICS_LISTEN": "localhost:http"})


# -- the console exporter; metrics are Prometheus's only ------------------------------


def test_the_console_span_exporter_writes_one_json_object_a_line_to_its_file(tmp_path, capsys):
    path = tmp_path / "otel.jsonl"
    tracer_provider = configure_tracing(
        "lightpath-test", exporter="console", console_file=str(path), set_global=False
    )
    with tracer_provider.get_tracer("t").start_as_current_span("one"):
        pass
    tracer_provider.shutdown()
    lines = path.read_text().splitlines()
    objects = [json.loads(line) for line in lines]  # every line is one whole object
    assert any(o.get("name") == "one" for o in objects)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""  # nothing on the log stream


@pytest.mark.parametrize("exporter", ["console", "otlp"])
def test_an_otel_metrics_exporter_is_refused_naming_the_variable(exporter):
    """OpenTelemetry exports traces only; the metrics are on the Prometheus endpoint."""
    with pytest.raises(SettingsError, match="OTEL_METRICS_EXPORTER"):
        load(CommonSettings, {"OTEL_METRICS_EXPORTER": exporter})
    with pytest.raises(RuntimeError, match=r"OTEL_METRICS_EXPORTER.*LIGHTPATH_METRICS_LISTEN"):
        configure_metrics("lightpath-test", exporter=exporter)


# -- Redis instrumentation ----------------------------------------------------------


async def test_an_instrumented_client_answers_as_before(redis_url):
    """Commands, pipelines, transactions and Lua scripts go through the timing wrapper
    unchanged (in a process serving no metrics `connect` leaves the client as it is: no cost)."""
    assert not redis_store.metrics_enabled()
    plain = redis_store.connect(redis_url)
    assert not getattr(plain, "_lightpath_instrumented", False)
    client = redis_store.instrument(redis_store.connect(redis_url))
    try:
        await client.set("metrics:k", "1")
        assert await client.get("metrics:k") == "1"
        pipe = client.pipeline(transaction=False)
        pipe.incr("metrics:k").get("metrics:k")
        assert await pipe.execute() == [2, "2"]

        async def bump(p):
            v = int(await p.get("metrics:k"))
            p.multi()
            p.set("metrics:k", v + 1)

        await client.transaction(bump, "metrics:k")
        assert await client.get("metrics:k") == "3"
        script = client.register_script("return redis.call('INCR', KEYS[1])")
        assert await script(keys=["metrics:k"]) == 4
        with pytest.raises(sync_redis.exceptions.ResponseError):
            await client.execute_command("LIGHTPATH.NO.SUCH.COMMAND")
    finally:
        await client.aclose()
        await plain.aclose()


# -- a service's endpoint, over HTTP ----------------------------------------------------


@pytest.fixture
def probe(redis_url, tmp_path):
    log = (tmp_path / "probe.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.metrics_probe", redis_url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, f"the probe did not start:\n{(tmp_path / 'probe.log').read_text()}"
        yield json.loads(line), sync_redis.Redis.from_url(redis_url)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return samples(resp.read().decode())


def wait_for(url: str, check, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = scrape(url)
        if check(found):
            return found
        assert time.monotonic() < deadline, "the metrics did not move in time"
        time.sleep(0.1)


def test_the_endpoint_serves_the_common_metrics_and_they_move(probe):
    addresses, redis = probe
    url = addresses["metrics"]
    assert url.startswith("http://127.0.0.1:")
    before = scrape(url)
    info = [ls for (n, ls) in before if n == "target_info"]
    assert info and ("service_name", "lightpath-core_broker") in info[0]
    rpc = "rpc_server_duration_milliseconds_count"
    get_info = {"rpc_method": "/lightpath.v1.CoreBroker/GetInfo", "rpc_grpc_status_code": "OK"}
    refused = {
        "rpc_method": "/lightpath.v1.CoreBroker/RemoveDevice",
        "rpc_grpc_status_code": "UNAUTHENTICATED",
    }

    # an RPC, and a call without a credential
    with grpc.insecure_channel(addresses["grpc"]) as ch:
        stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
        stub.GetInfo(common_pb2.GetInfoRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as err:
            stub.RemoveDevice(core_broker_pb2.RemoveDeviceRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # The server records a call as it finishes, which may be just after the client has
    # its answer: wait for the counts to move, then check they moved by exactly one.
    failures = "lightpath_auth_failures_total"

    def moved_by_one(f) -> bool:
        return (
            value(f, rpc, **get_info) >= value(before, rpc, **get_info) + 1
            and value(f, rpc, **refused) >= value(before, rpc, **refused) + 1
            and value(f, failures, reason="MISSING_CREDENTIAL")
            >= value(before, failures, reason="MISSING_CREDENTIAL") + 1
        )

    after = wait_for(url, moved_by_one, timeout=5)
    assert value(after, rpc, **get_info) == value(before, rpc, **get_info) + 1
    assert value(after, rpc, **refused) == value(before, rpc, **refused) + 1
    assert value(after, failures, reason="MISSING_CREDENTIAL") == (
        value(before, failures, reason="MISSING_CREDENTIAL") + 1
    )
    # Redis commands (the probe's loop GETs every 50 ms), with sub-millisecond buckets
    gets = "lightpath_redis_command_duration_seconds_count"
    moved = wait_for(
        url, lambda f: value(f, gets, command="GET") > value(after, gets, command="GET")
    )
    buckets = {
        dict(ls)["le"]
        for (n, ls) in moved
        if n == "lightpath_redis_command_duration_seconds_bucket" and ("command", "GET") in ls
    }
    assert {"0.0001", "0.001", "300.0", "+Inf"} <= buckets
    assert value(moved, "lightpath_task_down", task=TASK) == 0

    # a Redis error that makes a supervised task fail: counted, restarted, down meanwhile
    redis.set(FAIL_KEY, "1")
    try:
        failing = wait_for(
            url,
            lambda f: (
                value(f, "lightpath_task_restarts_total", task=TASK) >= 2
                and value(f, "lightpath_task_down", task=TASK) == 1
            ),
        )
        assert (
            value(
                failing,
                "lightpath_redis_command_errors_total",
                command="LIGHTPATH.NO.SUCH.COMMAND",
                error="ResponseError",
            )
            >= 2
        )
    finally:
        redis.delete(FAIL_KEY)
    # healthy again once a run has lasted a second
    wait_for(url, lambda f: value(f, "lightpath_task_down", task=TASK) == 0)
