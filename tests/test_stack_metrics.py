"""The local stack with metrics on (issue 18): one process of each service, every
scrape endpoint answers over HTTP with its service's common metrics, they move, and
`lightpath status` (and its --json) lists each process's metrics URL."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lightpath.stack import Stack, default_topology, health_status, with_ephemeral_ports
from tests.common.test_metrics import samples, value

pytestmark = pytest.mark.slow

ONE_OF_EACH = ("cell-scheduler", "ocs-pod-1", "ws-pod-1", "core-broker", "agg-root")


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return samples(resp.read().decode())


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    specs = [s for s in with_ephemeral_ports(default_topology()) if s.name in ONE_OF_EACH]
    state_dir = tmp_path_factory.mktemp("stack")
    # Console span export on: its output must stay out of the log.
    st = Stack(
        state_dir,
        specs=specs,
        redis_port=0,
        log=lambda *_: None,
        extra_env={"OTEL_TRACES_EXPORTER": "console"},
    )
    st.start(timeout=120)
    try:
        yield st
    finally:
        st.stop()


def test_every_process_serves_its_metrics_on_loopback(stack):
    assert set(stack.metrics_endpoints) == set(ONE_OF_EACH)
    creds = stack.operator
    for spec in stack.specs:
        url = stack.metrics_endpoints[spec.name]
        assert url == f"http://127.0.0.1:{spec.metrics_port}/metrics"
        before = scrape(url)
        (info,) = [dict(ls) for (n, ls) in before if n == "target_info"]
        assert info["service_name"] == f"lightpath-{spec.service}", spec.name
        assert info["service_instance_id"] == spec.name
        # Redis: at least the start's PING, timed
        redis_count = "lightpath_redis_command_duration_seconds_count"
        assert value(before, redis_count) > 0, spec.name
        # an RPC moves rpc.server.duration by exactly one, under its method and code
        check = {"rpc_method": "/grpc.health.v1.Health/Check", "rpc_grpc_status_code": "OK"}
        rpc = "rpc_server_duration_milliseconds_count"
        assert health_status(spec_address(spec), credentials=creds) == "SERVING"
        after = scrape(url)
        assert value(after, rpc, **check) == value(before, rpc, **check) + 1, spec.name
        # the supervisor reports its tasks (none down)
        down = [ls for (n, ls) in after if n == "lightpath_task_down"]
        assert all(after[("lightpath_task_down", ls)] == 0 for ls in down), spec.name


def spec_address(spec) -> str:
    return f"127.0.0.1:{spec.port}"


def test_redis_metrics_move_while_the_pods_report_to_the_cell(stack):
    url = stack.metrics_endpoints["cell-scheduler"]
    name = "lightpath_redis_command_duration_seconds_count"
    first = value(scrape(url), name)
    deadline = time.monotonic() + 30
    while value(scrape(url), name) <= first:
        assert time.monotonic() < deadline, "the cell ran no Redis command in 30 s"
        time.sleep(0.5)


def test_the_log_stream_holds_only_json_lines(stack):
    """stderr (the log) and stdout (the console span exporter, one span a line) go to
    different files: the workload scheduler's calls to the cell make spans in both."""
    logs = Path(stack.state_dir) / "logs"
    deadline = time.monotonic() + 30
    for name in ("cell-scheduler", "ws-pod-1"):
        spans = logs / f"{name}.otel.jsonl"
        while not spans.read_text().strip():
            assert time.monotonic() < deadline, f"{name} exported no span in 30 s"
            time.sleep(0.5)
        for line in spans.read_text().splitlines():
            assert json.loads(line)["context"]["trace_id"]
    for name in ONE_OF_EACH:
        lines = (logs / f"{name}.log").read_text().splitlines()
        assert lines, name
        for line in lines:
            record = json.loads(line)
            assert "msg" in record and "context" not in record, (name, line)


def test_status_lists_each_metrics_url(stack):
    env = {"LIGHTPATH_STATE_DIR": str(stack.state_dir), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightpath",
            "status",
            "--json",
            "--state-dir",
            str(stack.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    status = json.loads(out.stdout)
    assert status["running"], out.stderr
    assert {n: s["metrics"] for n, s in status["services"].items()} == stack.metrics_endpoints
    text = subprocess.run(
        [sys.executable, "-m", "lightpath", "status", "--state-dir", str(stack.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    ).stdout
    for url in stack.metrics_endpoints.values():
        assert url in text
