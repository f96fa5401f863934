#!/usr/bin/env python3
"""Write deploy/docker-compose.yml from the local stack's topology (lightpath/stack.py).

    python scripts/gen_compose.py

Run it after changing the topology; tests/test_compose.py checks the file
against the code either way (commands, settings, ports, peers).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightpath.security.pki import file_stem  # noqa: E402
from lightpath.stack import default_topology, process_env  # noqa: E402

specs = default_topology()


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
#   docker compose -f deploy/docker-compose.yml up --build
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
    image: redis:7.2-alpine
    # The password reaches redis-server as configuration on stdin, not in its arguments.
    command:
      - sh
      - -c
      - >-
        printf 'requirepass "%s"\\n' "$$(cat /run/secrets/redis_password)"
        | exec docker-entrypoint.sh redis-server - --appendonly yes --appendfsync everysec
    secrets:
      - redis_password
    volumes:
      - redis-data:/data
    healthcheck:
      test: ["CMD-SHELL", 'REDISCLI_AUTH="$$(cat /run/secrets/redis_password)" redis-cli ping | grep -q PONG']
      interval: 5s
      timeout: 2s
      retries: 10
"""
]
for s in specs:
    env = process_env(s, specs, "redis://redis:6379/0", host="compose")
    env.setdefault("LIGHTPATH_INSTANCE_ID", s.name)
    env["LIGHTPATH_LOG_FORMAT"] = "json"
    env["OTEL_TRACES_EXPORTER"] = "none"
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
    for dep in ["redis", *sorted({p for p in s.peers.values() if p != s.name})]:
        lines += [f"      {dep}:", "        condition: service_healthy"]
    lines.append("    secrets:")
    for secret in ("redis_password", "ca_cert", secret_name(s, "cert"), secret_name(s, "key")):
        lines.append(f"      - {secret}")
    lines.append("    environment:")
    for k, v in env.items():
        lines.append(f'      {k}: "{v}"')
    lines += [
        "    ports:",
        f'      - "127.0.0.1:{s.port}:{s.port}"',
        "    healthcheck:",
        f'      test: ["CMD", "python", "-m", "lightpath.healthcheck", "127.0.0.1:{s.port}"]',
        "      interval: 5s",
        "      timeout: 3s",
        "      retries: 10",
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
out.append("\n".join(secrets) + "\n")
out.append("volumes:\n  redis-data:\n")
(ROOT / "deploy" / "docker-compose.yml").open("w").write("\n".join(out))
