"""The local stack with metrics on (issue 18): one process of each service, every
scrape endpoint answers over HTTP with its service's common metrics, they move, and
`lightpath status` (and its --json) lists each process's metrics URL. Issue 33: every
counter series an alert rule reads is on the endpoint from the start (an increase()
over a series born with its first event misses that event), and the stack writes a
Prometheus configuration for the ports it took."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from lightpath.embedded_redis import free_port
from lightpath.stack import (
    CONSOLE_NAME,
    Stack,
    default_topology,
    health_status,
    with_ephemeral_ports,
)
from lightpath_services.common.metric_names import ALL
from tests.common.test_metrics import samples, value

# One stack for the module: its tests share a worker (else each worker starts its own).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("stack-metrics")]

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
        console_port=free_port(),
    )
    st.start(timeout=120)
    try:
        yield st
    finally:
        st.stop()


def test_every_process_serves_its_metrics_on_loopback(stack):
    assert set(stack.metrics_endpoints) == {*ONE_OF_EACH, CONSOLE_NAME}
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
        # (a call is recorded as it finishes, maybe just after the client has its answer)
        after = eventually(
            url,
            lambda f, b=before, r=rpc, k=check: value(f, r, **k) >= value(b, r, **k) + 1,
            f"{spec.name}'s health call counted",
            timeout=5,
        )
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
    services = {n: u for n, u in stack.metrics_endpoints.items() if n != CONSOLE_NAME}
    assert {n: s["metrics"] for n, s in status["services"].items()} == services
    text = subprocess.run(
        [sys.executable, "-m", "lightpath", "status", "--state-dir", str(stack.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    ).stdout
    for url in stack.metrics_endpoints.values():
        assert url in text


def eventually(url: str, check, what: str, timeout: float = 30.0) -> dict:
    """A scrape of `url` once `check(scrape)` holds (gauges refresh every few seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = scrape(url)
        if check(found):
            return found
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.25)


def test_domain_metrics_move_with_the_work(stack):
    """A job submitted and one of its blocks failed, a reservation made and an
    aggregation run: each service's domain metrics on its endpoint say so."""
    import asyncio

    import numpy as np
    from google.protobuf.duration_pb2 import Duration

    from lightpath.aggregation.node import aggregate_all, local_node_credentials
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as agg
    from lightpath.v1 import agg_switch_pb2_grpc, cell_scheduler_pb2_grpc, core_broker_pb2_grpc
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import common_pb2 as c
    from lightpath.v1 import core_broker_pb2 as cb
    from lightpath.v1 import workload_scheduler_pb2 as ws
    from lightpath_services.common.metric_names import prometheus_name

    urls = stack.metrics_endpoints

    def p(otel: str, unit: str = "") -> str:
        return prometheus_name(otel, unit)

    wires = p("lightpath.ocs.change.duration", "s") + "_count"
    admitted = p("lightpath.pod.admission.attempts") + "_total"
    before = {n: scrape(u) for n, u in urls.items()}

    async def work() -> None:
        creds = stack.operator
        ep = stack.endpoints
        async with (
            channel(ep["cell-scheduler"], credentials=creds) as cell_ch,
            channel(ep["core-broker"], credentials=creds) as broker_ch,
            channel(ep["agg-root"], credentials=creds) as agg_ch,
        ):
            cell = cell_scheduler_pb2_grpc.CellSchedulerStub(cell_ch)
            for _ in range(300):  # pod-1 registered and reporting its capacity
                pods = (await cell.ListPods(cs.ListPodsRequest())).pods
                if any(x.capacity.types and x.status == cs.POD_STATUS_READY for x in pods):
                    break
                await asyncio.sleep(0.1)
            job = await cell.SubmitJob(
                cs.SubmitJobRequest(
                    spec=ws.JobSpec(job_id="metered", shape=c.Shape(dims=[8, 4, 4]))
                )
            )
            assert job.job.state == c.JOB_STATE_RUNNING, job
            await cell.ReportBlockHealth(
                cs.ReportCellBlockHealthRequest(
                    pod_id="pod-1",
                    block_id=job.job.pod_job.blocks[0].block_id,
                    health=c.BLOCK_HEALTH_FAILED,
                    reason="metrics test",
                )
            )
            broker = core_broker_pb2_grpc.CoreBrokerStub(broker_ch)
            await broker.RegisterDevice(
                cb.RegisterDeviceRequest(
                    device=cb.Device(device_id="gpu-m", kind=cb.DEVICE_KIND_GPU, cores=8)
                )
            )
            app = await broker.RegisterApplication(
                cb.RegisterApplicationRequest(application_id="metered-app")
            )
            md = (("authorization", f"Bearer {app.token}"),)
            d = Duration(seconds=3600)
            r = await broker.Reserve(
                cb.ReserveRequest(
                    request=cb.ReservationRequest(reservation_id="r-m", cores=4, duration=d)
                ),
                metadata=md,
            )
            assert r.outcome == cb.OUTCOME_GRANTED, r
            root = agg_switch_pb2_grpc.AggSwitchStub(agg_ch)
            nodes = ["n1", "n2"]
            await root.DefineTopology(
                agg.DefineTopologyRequest(
                    topology=agg.AggTopology(
                        tree_id="tree-1",
                        nodes=[
                            agg.AggNode(
                                id="root", kind=agg.AGG_NODE_KIND_SWITCH, threshold_ms=5000
                            ),
                            *(
                                agg.AggNode(id=n, kind=agg.AGG_NODE_KIND_COMPUTE, parent="root")
                                for n in nodes
                            ),
                        ],
                    )
                )
            )
            await root.StartCommand(
                agg.StartCommandRequest(
                    command_id="metered",
                    participants=nodes,
                    length=8,
                    dtype=agg.AGG_DTYPE_INT64,
                    op=agg.AGG_OP_SUM,
                    deadline=Duration(seconds=20),
                )
            )
            node_creds = await local_node_credentials(nodes, state_dir=Path(stack.state_dir))
            out = await aggregate_all(
                ep["agg-root"],
                "metered",
                {n: np.arange(8, dtype=np.int64) for n in nodes},
                credentials=node_creds.get,
            )
            assert all(np.array_equal(v.values, np.arange(8) * 2) for v in out.values())

    asyncio.run(work())

    def more(service: str, name: str, by: float = 1, **labels: str):
        return lambda f: value(f, name, **labels) >= value(before[service], name, **labels) + by

    eventually(
        urls["cell-scheduler"],
        more("cell-scheduler", p("lightpath.cell.submit_to_running.duration", "s") + "_count"),
        "the cell's submit-to-running histogram",
    )
    eventually(
        urls["cell-scheduler"],
        lambda f: (
            value(f, p("lightpath.cell.jobs"), state="JOB_STATE_RUNNING") >= 1
            or value(f, p("lightpath.cell.jobs"), state="RUNNING") >= 1
        ),
        "the cell's RUNNING job gauge",
    )
    eventually(urls["ws-pod-1"], more("ws-pod-1", admitted, result="admitted"), "an admission")
    eventually(
        urls["ws-pod-1"],
        lambda f: value(f, p("lightpath.pod.blocks"), state="failed") >= 1,
        "a failed block on the pod's block gauge",
    )
    eventually(
        urls["ws-pod-1"],
        more("ws-pod-1", p("lightpath.pod.block_replacements") + "_total"),
        "the failed block's replacement",
    )
    eventually(urls["ocs-pod-1"], more("ocs-pod-1", wires, op="wire"), "a wiring")
    eventually(
        urls["ocs-pod-1"],
        lambda f: value(f, p("lightpath.ocs.cross_connects")) > 0,
        "cross-connects in use",
    )
    eventually(
        urls["core-broker"],
        more("core-broker", p("lightpath.broker.decisions") + "_total", outcome="granted"),
        "a granted decision",
    )
    eventually(
        urls["core-broker"],
        lambda f: value(f, p("lightpath.broker.cores.reserved"), device="gpu-m", window="now") >= 4,
        "the device's reserved cores",
    )
    eventually(
        urls["agg-root"],
        more("agg-root", p("lightpath.agg.commands") + "_total"),
        "a finished aggregation",
    )
    eventually(
        urls["agg-root"],
        more("agg-root", p("lightpath.agg.bytes_aggregated", "By") + "_total", by=2 * 8 * 8),
        "the bytes aggregated",
    )


# -- issue 33: the series the alert rules read exist before their first event ----------

ROOT = Path(__file__).resolve().parent.parent
RULES = [
    r
    for g in yaml.safe_load((ROOT / "deploy/monitoring/alerts.yml").read_text())["groups"]
    for r in g["rules"]
]
# Counters whose label values cannot all be known at start; their rules do not need them:
BORN_WITH_AN_EVENT = {
    # a rate sustained for minutes: a series born mid-burst still fires
    "lightpath_redis_command_errors_total",
    "lightpath_auth_failures_total",
    # the rule also fires on a series that appears (`unless ... offset 5m`)
    "rpc_server_duration_milliseconds_count",
}
_COUNTED = re.compile(r"(?:increase|rate)\(\s*([a-z_:]+_(?:total|count))(\{[^}]*\})?\[")


def counters_the_rules_count() -> dict[str, list[dict[str, str]]]:
    """Counter sample name -> the label matchers (label="value") each rule selects it by."""
    out: dict[str, list[dict[str, str]]] = {}
    for rule in RULES:
        for name, matchers in _COUNTED.findall(rule["expr"]):
            exact = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
            out.setdefault(name, []).append(exact)
    return out


def test_the_rules_count_counters_this_test_can_see():
    found = counters_the_rules_count()
    assert "lightpath_pod_block_replacements_total" in found
    assert {"result": "replaced"} in found["lightpath_pod_block_replacements_total"]
    assert "lightpath_ocs_invariant_failures_total" in found


def test_every_counter_an_alert_counts_is_exported_from_the_start(stack):
    """Each counter an alert's increase()/rate() reads is on the endpoint of every process
    of the service that exports it, for the label values the rule selects, and, per pod,
    for that process's pod: present before its first event (at 0; a test of this module
    may have moved some since), so the first event is seen (issue 33, item 1)."""
    service_of = {s: m.service for m in ALL for s in m.series}
    by_name = {s.name: s for s in stack.specs}
    agents = any(s.service == "switch_agent" for s in stack.specs)
    checked = 0
    for name, selections in counters_the_rules_count().items():
        if name in BORN_WITH_AN_EVENT:
            continue
        if name == "lightpath_ocs_switch_repairs_total" and not agents:
            continue  # exported by ocs_managers behind switch agents only
        service = service_of[name]
        procs = [
            s for s in stack.specs if service == "common" or s.service == service.replace("-", "_")
        ]
        assert procs, f"no process of this stack exports {name}"
        for spec in procs:
            found = scrape(stack.metrics_endpoints[spec.name])
            pod = by_name[spec.name].env.get("LIGHTPATH_POD_ID")
            for exact in selections:
                want = {**exact, **({"pod": pod} if pod and "pod" in _labels(name) else {})}
                present = [ls for (n, ls) in found if n == name and set(want.items()) <= ls]
                assert present, (
                    f"{spec.name} does not export {name}{want} before its first event: "
                    "an alert's increase() over it would miss that event"
                )
                checked += 1
    assert checked >= 4


def _labels(sample: str) -> tuple[str, ...]:
    return next(m.labels for m in ALL if sample in m.series)


def test_the_stack_writes_a_prometheus_config_for_the_ports_it_took(stack):
    path = Path(stack.state_dir) / "prometheus.yml"
    config = yaml.safe_load(path.read_text())
    (job,) = config["scrape_configs"]
    targets = {g["labels"]["process"]: g["targets"] for g in job["static_configs"]}
    assert targets == {
        name: [url.removeprefix("http://").removesuffix("/metrics")]
        for name, url in stack.metrics_endpoints.items()
    }
    (rules,) = config["rule_files"]
    assert Path(rules) == ROOT / "deploy/monitoring/alerts.yml"
    status = json.loads(
        subprocess.run(
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
        ).stdout
    )
    assert status["prometheus_config"] == str(path)
    promtool = shutil.which("promtool")
    if promtool:
        out = subprocess.run(
            [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr


def test_the_console_serves_the_state_of_its_watches(stack):
    """What LightpathConsoleDown / LightpathConsoleStale read: the console is scraped, and
    its supervised watches report lightpath_task_down (0: none failing)."""
    found = eventually(
        stack.metrics_endpoints[CONSOLE_NAME],
        lambda f: any(n == "lightpath_task_down" for (n, _) in f),
        "the console's tasks reported",
    )
    (info,) = [dict(ls) for (n, ls) in found if n == "target_info"]
    assert info["service_name"] == "lightpath-console"
    down = {dict(ls)["task"]: v for (n, ls), v in found.items() if n == "lightpath_task_down"}
    assert down and not any(down.values()), down
