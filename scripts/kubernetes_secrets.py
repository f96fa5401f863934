#!/usr/bin/env python3
"""Print the `kubectl create secret` commands that put the files scripts/compose_secrets.py
makes in DIR into the Secrets deploy/kubernetes mounts (names only: values stay in files).

    python3 scripts/kubernetes_secrets.py deploy/secrets | sh

Secret <process>-tls for each process of the deployed topology (and the console),
lightpath-ca and lightpath-redis; tests/test_kubernetes.py checks these are exactly the
Secrets the rendered Deployments mount.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightpath.security.identity import console_principal
from lightpath.security.pki import file_stem
from lightpath.stack import CONSOLE_NAME, deployed_topology

NAMESPACE = "lightpath"


def secret_commands(directory: str) -> str:
    ns = f"kubectl -n {NAMESPACE} create secret"
    lines = [
        f"kubectl create namespace {NAMESPACE}  # or apply the overlay's namespace.yaml first",
        f"{ns} generic lightpath-ca --from-file=ca.crt={directory}/ca.crt",
        f"{ns} generic lightpath-redis --from-file=password={directory}/redis.password",
    ]
    processes = [(s.name, s.principal) for s in deployed_topology()]
    for name, principal in [*processes, (CONSOLE_NAME, console_principal())]:
        stem = f"{directory}/{file_stem(principal)}"
        lines.append(f"{ns} tls {name}-tls --cert={stem}.crt --key={stem}.key")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(secret_commands(sys.argv[1].rstrip("/")), end="")
