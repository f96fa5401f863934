#!/usr/bin/env python3
"""Write deploy/docker-compose.yml from the local stack's topology (lightpath/stack.py),
and the Prometheus side of it under deploy/monitoring/:

    deploy/monitoring/prometheus.yml                  scrape config of the compose stack
    deploy/monitoring/prometheus.local.yml            the same for `lightpath up` (loopback)
    deploy/monitoring/docker-compose.monitoring.yml   Prometheus + Grafana beside the stack

    python scripts/gen_compose.py

Run it after changing the topology; tests/test_compose.py and
tests/test_monitoring.py check the files against the code either way
(commands, settings, ports, peers, scrape targets).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightpath.security.identity import console_principal  # noqa: E402
from lightpath.security.pki import file_stem  # noqa: E402
from lightpath.stack import (  # noqa: E402
    CONSOLE_METRICS_PORT,
    CONSOLE_NAME,
    CONSOLE_PORT,
    console_env,
    default_topology,
    deployed_topology,
    process_env,
    prometheus_config,
)

specs = deployed_topology()  # with switch agents
# The host port a process's gRPC port is published on (the containers listen on the
# local stack's ports, each in its own network namespace).
PUBLISHED_PORT_OFFSET = -40000
# A probe is a Python process importing grpc: seconds of CPU on a loaded host, so one
# every 10 s; failures in the first 3 minutes do not count (a 2-core machine starts
# 15 containers at once). The engine runs a container's first probe one interval after
# it started (Docker Engine 20.10 has no `start_interval`), so a service waits only for
# Redis to be healthy (a redis-cli ping a second, cheap) and for its Lightpath peers to
# have started: it reaches a peer that starts listening later within a second or two
# (lightpath.client's reconnect bound), as it does when a peer restarts. Waiting for
# each peer to be healthy made `up` one interval per link of the longest chain (switch
# agent, ocs_manager, scheduler): 43 s on 2 cores, where the services were SERVING in
# a few.
HEALTH_TIMING = [
    "      interval: 10s",
    "      timeout: 20s",
    "      start_period: 180s",
    "      retries: 6",
]
METRICS_PORT = 9464  # every service's scrape endpoint inside its container (the OTel default)


def secret_name(spec, part: str) -> str:
    return f"{spec.name}_{part}"


def secret_file(spec, part: str) -> str:
    return f"./secrets/{file_stem(spec.principal)}.{'crt' if part == 'cert' else 'key'}"


out = [
    """# The local stack of `lightpath up`, in containers: Redis (AOF on a volume) and
# the same processes, ports and settings (tests/test_compose.py keeps this file
# and lightpath/stack.py in agreement).
#
#   python scripts/compose_secrets.py deploy/secrets   # CA, certificates, Redis password
#   python scripts/compose_image.py                    # the image, with no registry
#   docker compose -f deploy/docker-compose.yml up
#
# Published ports are the host's 127.0.0.1:<gRPC port - 40000> (10051-10093) and
# 8443 (the web console): below the kernel's ephemeral range (32768-60999 on a
# stock Linux host), so an outgoing connection never holds one when `up` binds it,
# and below the ports lightpath picks for processes of its own (20000-32767).
#
# Secure by default: every service serves mTLS with its own certificate (its
# compose name is in it), Redis needs a password and is not published, and
# only 127.0.0.1 of the host reaches the published gRPC ports. Secrets come
# from files (deploy/secrets, not committed), never from this file.
name: lightpath

x-lightpath: &lightpath
  build:
    context: ..
    dockerfile: deploy/Dockerfile
  image: lightpath:dev
  restart: unless-stopped
  stop_grace_period: 15s

services:
  redis:
    <<: *lightpath
    # Debian's redis-server from the same image, as its uid 10001 (which owns the
    # password file). The password reaches it in a configuration file on a tmpfs,
    # not in its arguments; `exec` makes redis-server PID 1, so `docker compose
    # down`'s SIGTERM reaches it and it shuts down at once (saving the AOF).
    command:
      - sh
      - -c
      - >-
        umask 077
        && printf 'requirepass "%s"\\n' "$$(cat /run/secrets/redis_password)" > /run/redis/redis.conf
        && exec redis-server /run/redis/redis.conf --dir /data --appendonly yes --appendfsync everysec
    tmpfs:
      - /run/redis:uid=10001,gid=10001,mode=0700
    secrets:
      - redis_password
    volumes:
      - redis-data:/data
    healthcheck:
      test: ["CMD-SHELL", 'REDISCLI_AUTH="$$(cat /run/secrets/redis_password)" redis-cli ping | grep -q PONG']
      interval: 1s
      timeout: 2s
      retries: 50
"""
]
for s in specs:
    env = process_env(s, specs, "redis://redis:6379/0", host="compose")
    env.setdefault("LIGHTPATH_INSTANCE_ID", s.name)
    env["LIGHTPATH_LOG_FORMAT"] = "json"
    env["OTEL_TRACES_EXPORTER"] = "none"
    env["LIGHTPATH_METRICS_LISTEN"] = f"0.0.0.0:{METRICS_PORT}"  # the compose network only
    env["LIGHTPATH_REDIS_PASSWORD_FILE"] = "/run/secrets/redis_password"
    env["LIGHTPATH_TLS_CA"] = "/run/secrets/ca_cert"
    env["LIGHTPATH_TLS_CERT"] = f"/run/secrets/{secret_name(s, 'cert')}"
    env["LIGHTPATH_TLS_KEY"] = f"/run/secrets/{secret_name(s, 'key')}"
    lines = [
        f"  {s.name}:",
        "    <<: *lightpath",
        f'    command: ["{s.console_script}"]',
        "    depends_on:",
    ]
    lines += ["      redis:", "        condition: service_healthy"]
    for dep in sorted({p for p in s.peers.values() if p != s.name}):
        lines += [f"      {dep}:", "        condition: service_started"]
    lines.append("    secrets:")
    for secret in ("redis_password", "ca_cert", secret_name(s, "cert"), secret_name(s, "key")):
        lines.append(f"      - {secret}")
    lines.append("    environment:")
    for k, v in env.items():
        lines.append(f'      {k}: "{v}"')
    lines += [
        "    ports:",
        f'      - "127.0.0.1:{s.port + PUBLISHED_PORT_OFFSET}:{s.port}"',
        "    healthcheck:",
        f'      test: ["CMD", "python", "-m", "lightpath.healthcheck", "127.0.0.1:{s.port}"]',
        *HEALTH_TIMING,
    ]
    out.append("\n".join(lines) + "\n")
# The web console (issue 21): HTTPS with its own certificate, a client of the services'
# gRPC API only (no Redis), published on the host's 127.0.0.1 only, where viewers who have
# not signed in get its read-only view (LIGHTPATH_CONSOLE_ANONYMOUS=read; set none to
# require a sign-in).
console = {
    **console_env(specs, CONSOLE_PORT, host="compose"),
    "LIGHTPATH_CONSOLE_ANONYMOUS": "read",
    "LIGHTPATH_INSTANCE_ID": "console",
    "LIGHTPATH_LOG_FORMAT": "json",
    "LIGHTPATH_TLS_CA": "/run/secrets/ca_cert",
    "LIGHTPATH_TLS_CERT": "/run/secrets/console_cert",
    "LIGHTPATH_TLS_KEY": "/run/secrets/console_key",
    "LIGHTPATH_METRICS_LISTEN": f"0.0.0.0:{METRICS_PORT}",
}
shown = [
    s.name
    for s in specs
    if s.service in ("cell_scheduler", "ocs_manager", "core_broker", "agg_switch")
]
lines = [
    "  console:",
    "    <<: *lightpath",
    '    command: ["lightpath-console"]',
    "    depends_on:",
]
for dep in shown:
    lines += [f"      {dep}:", "        condition: service_started"]
lines += [
    "    secrets:",
    "      - ca_cert",
    "      - console_cert",
    "      - console_key",
    "    environment:",
]
lines += [f'      {k}: "{v}"' for k, v in console.items()]
lines += [
    "    ports:",
    f'      - "127.0.0.1:{CONSOLE_PORT}:{CONSOLE_PORT}"',
    "    healthcheck:",
    "      test:",
    "        - CMD",
    "        - python",
    "        - -c",
    "        - import sys; from lightpath.stack import console_health; "
    f"sys.exit(console_health('https://127.0.0.1:{CONSOLE_PORT}/', '/run/secrets/ca_cert') != 'SERVING')",
    *HEALTH_TIMING,
]
out.append("\n".join(lines) + "\n")
secrets = [
    "secrets:",
    "  redis_password:",
    "    file: ./secrets/redis.password",
    "  ca_cert:",
    "    file: ./secrets/ca.crt",
]
for s in specs:
    for part in ("cert", "key"):
        secrets += [f"  {secret_name(s, part)}:", f"    file: {secret_file(s, part)}"]
for part, ext in (("cert", "crt"), ("key", "key")):
    secrets += [f"  console_{part}:", f"    file: ./secrets/{file_stem(console_principal())}.{ext}"]
out.append("\n".join(secrets) + "\n")
out.append("volumes:\n  redis-data:\n")
(ROOT / "deploy" / "docker-compose.yml").open("w").write("\n".join(out))


# -- deploy/monitoring ---------------------------------------------------------

GENERATED = "# Written by scripts/gen_compose.py from lightpath/stack.py: do not edit.\n"


def scrape_config(targets: list[tuple[str, str]], comment: str) -> str:
    """A Prometheus configuration scraping `targets` ((address, process) pairs) as job
    lightpath, each labelled with its process and service, and loading the alert rules."""
    service = {s.name: s.service for s in specs} | {CONSOLE_NAME: "console"}
    return prometheus_config(
        [(address, name, service[name]) for address, name in targets],
        rule_files=["alerts.yml"],
        header=GENERATED + comment,
    )


monitoring = ROOT / "deploy" / "monitoring"
monitoring.mkdir(exist_ok=True)
(monitoring / "prometheus.yml").write_text(
    scrape_config(
        [(f"{s.name}:{METRICS_PORT}", s.name) for s in specs]
        + [(f"{CONSOLE_NAME}:{METRICS_PORT}", CONSOLE_NAME)],
        "# The compose stack's Prometheus (docker-compose.monitoring.yml): every service's\n"
        "# LIGHTPATH_METRICS_LISTEN endpoint on the compose network.\n",
    )
)
(monitoring / "prometheus.local.yml").write_text(
    scrape_config(
        [(f"127.0.0.1:{s.metrics_port}", s.name) for s in default_topology()]
        + [(f"127.0.0.1:{CONSOLE_METRICS_PORT}", CONSOLE_NAME)],
        "# `lightpath up`'s processes (fixed ports: gRPC port + 1000, on loopback; the web\n"
        "# console's HTTPS port + 1000):\n"
        "#   prometheus --config.file=deploy/monitoring/prometheus.local.yml\n"
        "# `lightpath up --ephemeral-ports` writes <state dir>/prometheus.yml for the ports\n"
        "# it took (`lightpath status` names it).\n",
    )
)
service_names = [s.name for s in specs]
compose_monitoring = [
    GENERATED,
    """# Prometheus (scraping every service, with the alert rules) and Grafana (the
# dashboards) beside the compose stack:
#
#   docker compose -f deploy/docker-compose.yml \\
#                  -f deploy/monitoring/docker-compose.monitoring.yml up --build
#
# Relative paths are the project directory's (deploy/, the first file's). Both
# are published on the host's 127.0.0.1 only; Grafana's admin password comes
# from deploy/secrets/grafana.password (make it, e.g. `openssl rand -hex 16`).
services:
  prometheus:
    image: prom/prometheus:v2.53.2
    command:
      - --config.file=/etc/prometheus/prometheus.yml
      - --storage.tsdb.retention.time=15d
    volumes:
      - ./monitoring/prometheus.yml:/etc/prometheus/prometheus.yml:ro
      - ./monitoring/alerts.yml:/etc/prometheus/alerts.yml:ro
      - prometheus-data:/prometheus
    ports:
      - "127.0.0.1:9090:9090"
    restart: unless-stopped
    depends_on:
"""
    + "".join(f"      - {n}\n" for n in service_names)
    + """  grafana:
    image: grafana/grafana:11.2.0
    environment:
      GF_SECURITY_ADMIN_PASSWORD__FILE: /run/secrets/grafana_password
      GF_AUTH_ANONYMOUS_ENABLED: "false"
    secrets:
      - grafana_password
    volumes:
      - ./monitoring/grafana/provisioning:/etc/grafana/provisioning:ro
      - ./monitoring/dashboards:/var/lib/grafana/dashboards:ro
    ports:
      - "127.0.0.1:3000:3000"
    restart: unless-stopped
    depends_on:
      - prometheus

secrets:
  grafana_password:
    file: ./secrets/grafana.password

volumes:
  prometheus-data:
""",
]
(monitoring / "docker-compose.monitoring.yml").write_text("".join(compose_monitoring))
