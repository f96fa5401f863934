"""deploy/monitoring and its Kubernetes side (issue 18): the alert rules pass `promtool
check rules` and their unit tests (`promtool test rules`), every dashboard is valid JSON
and what its generator writes, every metric a query or rule names is one a service
exports (services/lightpath_services/common/metric_names.py), the scrape configs scrape every process of
the topology, and docs/operations.md explains every alert."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate as kv
import pytest
import yaml

from lightpath.stack import (
    CONSOLE_METRICS_PORT,
    CONSOLE_NAME,
    default_topology,
    deployed_topology,
)
from lightpath_services.common.metric_names import exported_series
from lightpath_services.common.settings import CommonSettings, load

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
KUBE_MONITORING = ROOT / "deploy" / "kubernetes" / "monitoring"
ALERTS = yaml.safe_load((MONITORING / "alerts.yml").read_text())
RULES = [r for g in ALERTS["groups"] for r in g["rules"]]
SPECS = deployed_topology()  # compose and Kubernetes: with switch agents
LOCAL = default_topology()  # `lightpath up`
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus); "
    "the rules' syntax and unit tests are not checked here",
)
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# -- PromQL: which metrics does an expression name ---------------------------------

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on"}


def metrics_in(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels, keywords)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e
    )  # label lists
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges and subqueries
    e = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", e)  # offset 5m
    e = re.sub(r"\$\{?\w+\}?", "", e)  # Grafana variables
    out = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        token = m.group(0)
        if e[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if token.lower() in _KEYWORDS:
            continue
        out.add(token)
    return out


def test_the_metric_name_extraction_can_fail():
    assert metrics_in(
        'histogram_quantile(0.99, sum by (le, process) (rate(a_bucket{x="y", le!="1"}[5m])))'
    ) == {"a_bucket"}
    assert metrics_in('sum(max by (d) (b{w="now"})) / sum(c) > 0.95 unless on (p) d') == {
        "b",
        "c",
        "d",
    }
    assert metrics_in('up{job="lightpath", process=~"$process"} == 0') == {"up"}
    assert metrics_in("a unless a offset 5m") == {"a"}


KNOWN = exported_series() | PROMETHEUS_SERIES


# -- alert rules ------------------------------------------------------------------------


def test_every_metric_the_rules_name_is_exported():
    for rule in RULES:
        unknown = metrics_in(rule["expr"]) - KNOWN
        assert not unknown, f"{rule['alert']} names metrics no service exports: {unknown}"


def test_the_required_alerts_exist_and_each_has_a_severity_a_summary_and_a_unit_test():
    names = {r["alert"] for r in RULES}
    assert {
        "LightpathPodSilent",
        "LightpathFailedBlockNotReplaced",
        "LightpathCellQueueGrowing",
        "LightpathInvariantCheckFailing",
        "LightpathRedisErrors",
        "LightpathBackgroundTaskRestarting",
        "LightpathReservationCapacityExhausted",
        "LightpathSubmitToRunningSlow",
        "LightpathSwitchesUnreachable",
        "LightpathSwitchDrifted",
        "LightpathConsoleDown",
        "LightpathConsoleStale",
    } <= names
    tests = yaml.safe_load((MONITORING / "alerts.test.yml").read_text())
    fired = {
        case["alertname"]
        for t in tests["tests"]
        for case in t["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert names == fired, f"alerts without a unit test that fires them: {names - fired}"
    for rule in RULES:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_operations_doc_explains_every_alert():
    doc = (ROOT / "docs" / "operations.md").read_text()
    for rule in RULES:
        assert f"`{rule['alert']}`" in doc, f"docs/operations.md does not explain {rule['alert']}"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub makes of a document's headings: lower case, punctuation other
    than `-` and `_` dropped, spaces to `-`, a repeat numbered."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in out:
            n += 1
            anchor = f"{slug}-{n}"
        out.add(anchor)
    return out


def test_every_alert_has_a_runbook_url_to_a_section_that_exists():
    anchors = github_anchors((ROOT / "docs" / "operations.md").read_text())
    for rule in RULES:
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", f"{rule['alert']}: runbook_url {url!r}"
        assert anchor in anchors, f"{rule['alert']}: docs/operations.md has no #{anchor}"


def test_github_anchors_are_made_as_github_makes_them():
    assert github_anchors("## Alerts\n### `LightpathPodSilent`\n## Alerts\n") == {
        "alerts",
        "lightpathpodsilent",
        "alerts-1",
    }


@needs_promtool
def test_promtool_checks_the_rules():
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(MONITORING / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in out.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules_pass():
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"],
        cwd=MONITORING,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path):
    """A rule changed so that it should not fire makes its unit test fail."""
    shutil.copy(MONITORING / "alerts.test.yml", tmp_path)
    (tmp_path / "alerts.yml").write_text(
        (MONITORING / "alerts.yml")
        .read_text()
        .replace(
            "max by (pod) (lightpath_cell_heartbeat_age_seconds) > 30",
            "max by (pod) (lightpath_cell_heartbeat_age_seconds) > 3000",
        )
    )
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "LightpathPodSilent" in out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_tests_catch_a_counter_born_with_its_first_event(tmp_path):
    """Issue 33: had the replacements counter appeared only with the first swap (as the
    services exported it before), increase() would see no swap and the alert would fire
    though the block was replaced: the unit tests, whose series start absent as a real
    scrape's do, say so."""
    tests = (MONITORING / "alerts.test.yml").read_text()
    born = 'result="replaced"}\'\n        values: "_ _ _ 1 1 1 1 1 1 1"'
    exported = 'result="replaced"}\'\n        values: "_ 0 0 1 1 1 1 1 1 1"'
    assert exported in tests
    (tmp_path / "alerts.test.yml").write_text(tests.replace(exported, born))
    shutil.copy(MONITORING / "alerts.yml", tmp_path)
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert 'pod="pod-2"' in out.stdout + out.stderr
    assert "LightpathFailedBlockNotReplaced" in out.stdout + out.stderr


@needs_promtool
@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus.local.yml"])
def test_promtool_checks_the_scrape_configs(config):
    out = subprocess.run(
        [PROMTOOL, "check", "config", str(MONITORING / config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# -- dashboards -------------------------------------------------------------------------

DASHBOARDS = sorted((MONITORING / "dashboards").glob("*.json"))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_panels_tile_the_grid_without_overlapping(path):
    """The dashboards are kept as reviewed JSON (Grafana's own export format): every panel
    lies within Grafana's 24 columns and no two panels cover the same cell."""
    taken: dict[tuple[int, int], str] = {}
    for panel in json.loads(path.read_text())["panels"]:
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_the_four_dashboards_the_issue_asks_for_exist():
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARDS}
    assert {
        "Lightpath / Cell overview",
        "Lightpath / Pod blocks and OCS",
        "Lightpath / Core broker",
        "Lightpath / Aggregation tree",
    } <= titles


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_valid_json_and_queries_only_exported_metrics(path):
    board = json.loads(path.read_text())
    assert board["uid"] and board["title"] and board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    queries = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            queries.append((panel["title"], target["expr"]))
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            queries.append((f"variable {v['name']}", v["definition"]))
    for title, expr in queries:
        for var in re.findall(r"\$(\w+)", expr):
            assert var in variables or var.startswith("__"), f"{title}: ${var} is not defined"
        expr = re.sub(r"label_values\((.*), \w+\)", r"\1", expr)
        unknown = metrics_in(expr) - KNOWN
        assert not unknown, f"{path.name} / {title} names metrics no service exports: {unknown}"


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus():
    provider = yaml.safe_load(
        (MONITORING / "grafana/provisioning/dashboards/lightpath.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load(
        (MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert source["datasources"][0]["url"] == "http://prometheus:9090"


# -- scrape configs and the compose stack -------------------------------------------------


def _targets(config: str) -> dict[str, str]:
    data = yaml.safe_load((MONITORING / config).read_text())
    (job,) = data["scrape_configs"]
    assert job["job_name"] == "lightpath"
    assert data["rule_files"] == ["alerts.yml"]
    out = {}
    for group in job["static_configs"]:
        (target,) = group["targets"]
        out[group["labels"]["process"]] = target
        if group["labels"]["process"] == CONSOLE_NAME:
            assert group["labels"]["service"] == "console"
            continue
        spec = next(s for s in SPECS if s.name == group["labels"]["process"])
        assert group["labels"]["service"] == spec.service.replace("_", "-")
    return out


def test_the_compose_scrape_config_scrapes_every_process():
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    assert _targets("prometheus.yml") == {s.name: f"{s.name}:9464" for s in SPECS} | {
        CONSOLE_NAME: f"{CONSOLE_NAME}:9464"
    }
    assert compose["services"][CONSOLE_NAME]["environment"]["LIGHTPATH_METRICS_LISTEN"] == (
        "0.0.0.0:9464"
    )
    for s in SPECS:
        svc = compose["services"][s.name]
        listen = svc["environment"]["LIGHTPATH_METRICS_LISTEN"]
        assert listen == "0.0.0.0:9464"
        assert all("9464" not in port for port in svc["ports"])  # the compose network only


def test_the_local_scrape_config_scrapes_lightpath_up():
    assert _targets("prometheus.local.yml") == {
        s.name: f"127.0.0.1:{s.metrics_port}" for s in LOCAL
    } | {CONSOLE_NAME: f"127.0.0.1:{CONSOLE_METRICS_PORT}"}
    ports = [s.metrics_port for s in SPECS] + [s.port for s in SPECS]
    assert len(ports) == len(set(ports)) and all(s.metrics_port for s in SPECS)


def test_the_monitoring_compose_file_adds_prometheus_and_grafana_with_existing_files():
    data = yaml.safe_load((MONITORING / "docker-compose.monitoring.yml").read_text())
    prometheus, grafana = data["services"]["prometheus"], data["services"]["grafana"]
    assert set(prometheus["depends_on"]) == {s.name for s in SPECS}
    for svc in (prometheus, grafana):
        for volume in svc["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):  # relative to deploy/, the first compose file's directory
                assert (ROOT / "deploy" / source).exists(), source
        assert all(port.startswith("127.0.0.1:") for port in svc["ports"])
    assert prometheus["ports"] == ["127.0.0.1:9090:9090"]


# -- Kubernetes ---------------------------------------------------------------------------


def _kube(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBE_MONITORING / name).read_text()) if d]


def test_kubernetes_pods_serve_metrics_where_the_service_monitor_looks():
    settings = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/base/settings.yaml").read_text())
        if d
    )["data"]
    listen = load(CommonSettings, settings).metrics_listen
    port = int(listen.rpartition(":")[2])
    (service,) = _kube("service.yaml")
    (monitor,) = _kube("servicemonitor.yaml")
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["port"] == svc_port["targetPort"] == port
    assert service["spec"]["selector"] == {"app.kubernetes.io/part-of": "lightpath"}
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the metrics' own `pod` (the superpod) wins
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"process", "service"} <= targets  # what the rules and dashboards group by
    (policy,) = _kube("network.yaml")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


def test_kubernetes_monitoring_objects_pass_the_schemas():
    for name in ("service.yaml", "network.yaml"):
        for obj in _kube(name):
            obj["metadata"]["namespace"] = "lightpath"
            kv.validate(obj, kv.latest_version(), strict=True)


def test_the_prometheus_rule_is_the_alert_rules():
    (rule,) = _kube("rules.yaml")
    assert rule["kind"] == "PrometheusRule"
    # a copy kept by hand (a PrometheusRule holds its rules inline): change both together
    assert rule["spec"]["groups"] == ALERTS["groups"], "copy alerts.yml's groups into rules.yaml"
    kustomization = _kube("kustomization.yaml")[0]
    assert set(kustomization["resources"]) == {
        p.name for p in KUBE_MONITORING.glob("*.yaml") if p.name != "kustomization.yaml"
    }


def test_the_monitoring_readme_lists_every_metric_under_its_prometheus_name():
    from lightpath_services.common.metric_names import ALL

    readme = (MONITORING / "README.md").read_text()
    for m in ALL:
        assert f"`{m.otel}`" in readme and f"`{m.prometheus}" in readme, m.otel
