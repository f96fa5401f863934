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

from lightpath.stack import default_topology, process_env  # noqa: E402

specs = default_topology()
out = [
    """# The local stack of `lightpath up`, in containers: Redis (AOF on a volume) and
# the same processes, ports and settings (tests/test_compose.py keeps this file
# and lightpath/stack.py in agreement).
#
#   docker compose -f deploy/docker-compose.yml up --build
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
    command: ["redis-server", "--appendonly", "yes", "--appendfsync", "everysec"]
    volumes:
      - redis-data:/data
    ports:
      - "6390:6379"
    healthcheck:
      test: ["CMD", "redis-cli", "ping"]
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
    lines = [
        f"  {s.name}:",
        "    <<: *lightpath",
        f'    command: ["{s.console_script}"]',
        "    depends_on:",
    ]
    for dep in ["redis", *sorted({p for p in s.peers.values() if p != s.name})]:
        lines += [f"      {dep}:", "        condition: service_healthy"]
    lines.append("    environment:")
    for k, v in env.items():
        lines.append(f'      {k}: "{v}"')
    lines += [
        "    ports:",
        f'      - "{s.port}:{s.port}"',
        "    healthcheck:",
        f'      test: ["CMD", "python", "-m", "lightpath.healthcheck", "127.0.0.1:{s.port}"]',
        "      interval: 5s",
        "      timeout: 3s",
        "      retries: 10",
    ]
    out.append("\n".join(lines) + "\n")
out.append("volumes:\n  redis-data:\n")
(ROOT / "deploy" / "docker-compose.yml").open("w").write("\n".join(out))
