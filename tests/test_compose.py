"""deploy/docker-compose.yml agrees with the code (there is no Docker engine here
to run it): every command exists, every variable it sets is one the service's
settings read, ports and peer addresses match the local stack's topology."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from lightpath.stack import default_topology, process_env
from services.common.settings import describe, load
from tests.helpers import settings_class

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SPECS = {s.name: s for s in default_topology()}


def test_compose_runs_exactly_the_local_stack_plus_redis():
    assert set(COMPOSE["services"]) == set(SPECS) | {"redis"}


def test_redis_persists_with_aof_on_a_volume():
    redis = COMPOSE["services"]["redis"]
    assert (
        "--appendonly" in redis["command"]
        and redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    )
    volume = redis["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_service_matches_code(name):
    spec, svc = SPECS[name], COMPOSE["services"][name]
    # the command is a console script that runs this service's __main__
    (script,) = svc["command"]
    assert SCRIPTS[script] == f"services.{spec.service}.__main__:main"
    assert (ROOT / "services" / spec.service / "__main__.py").exists()
    # every variable it sets is read by the service's settings, and parses
    env = {k: str(v) for k, v in svc["environment"].items()}
    known = {d.env for d in describe(settings_class(spec.service))}
    assert set(env) <= known, f"{name} sets variables its settings do not read: {set(env) - known}"
    load(settings_class(spec.service), env)
    # the same ports, peers and service settings as `lightpath up`
    expected = process_env(spec, default_topology(), "redis://redis:6379/0", host="compose")
    for var, value in expected.items():
        assert env.get(var) == value, (
            f"{name}: {var} is {env.get(var)!r}, the local stack uses {value!r}"
        )
    assert svc["ports"] == [f"{spec.port}:{spec.port}"]
    assert svc["healthcheck"]["test"][-1] == f"127.0.0.1:{spec.port}"
    assert "lightpath.healthcheck" in svc["healthcheck"]["test"]
    # it waits for what it talks to
    assert {"redis", *(p for p in spec.peers.values() if p != name)} <= set(svc["depends_on"])


def test_dockerfile_installs_the_packages_compose_runs():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for part in ("COPY lightpath", "COPY services", "pip install ."):
        assert part in dockerfile
    assert COMPOSE["x-lightpath"]["build"]["dockerfile"] == "deploy/Dockerfile"
