"""`python -m lightpath.healthcheck HOST:PORT [SERVICE]`: exit 0 when SERVING.

The container healthcheck of deploy/docker-compose.yml (no grpc_health_probe
binary needed in the image)."""

from __future__ import annotations

import sys

from lightpath.stack import health_status


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m lightpath.healthcheck HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    status = health_status(argv[0], argv[1] if len(argv) > 1 else "")
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
