#!/usr/bin/env python3
"""Make the files deploy/docker-compose.yml takes as secrets (never committed):

    python scripts/compose_secrets.py deploy/secrets

A CA (ca.crt, ca.key), one certificate + key per process of the local stack's
topology with the process's compose name as its DNS name (peers reach each
other by it) and its Lightpath identity (spiffe://lightpath/service/...), the
operator's certificate for the CLI, the web console's certificate, and a random Redis
password. Existing files
are kept (run again after the topology changes: only what is missing is made).
With your own CA, put your files under the same names instead.

The containers run as uid 10001: run as root and the keys are given to that
uid with mode 0600; otherwise they are left readable (0644) inside a 0700
directory, and the script says so.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightpath.security.identity import OPERATOR, Principal, console_principal  # noqa: E402
from lightpath.security.pki import LocalCA  # noqa: E402
from lightpath.stack import deployed_topology  # noqa: E402

CONTAINER_UID = 10001


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[0]).resolve()
    ca = LocalCA(directory, common_name="Lightpath compose CA").ensure()
    keys = [ca.issue(Principal(OPERATOR, OPERATOR)).key]
    for spec in deployed_topology():
        keys.append(ca.issue(spec.principal, hosts=(spec.name,)).key)
    keys.append(ca.issue(console_principal(), hosts=("console",)).key)  # the web console
    password = directory / "redis.password"
    if not password.exists():
        password.write_text(secrets.token_urlsafe(32) + "\n")
    readable = [password, *keys]
    if os.geteuid() == 0:
        for path in readable:
            os.chown(path, CONTAINER_UID, CONTAINER_UID)
            os.chmod(path, 0o600)
    else:
        for path in readable:
            os.chmod(path, 0o644)
        print(
            f"note: not root, so the keys in {directory} are 0644 (the containers' uid "
            f"{CONTAINER_UID} must read them); the directory itself is 0700"
        )
    os.chmod(directory, 0o700)
    print(f"compose secrets in {directory}: CA, {len(keys)} certificates, Redis password")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
