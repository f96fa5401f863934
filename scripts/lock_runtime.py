#!/usr/bin/env python3
"""Write deploy/requirements.lock: exact versions, from this environment (.venv), of every
package the image runs: [project.dependencies] and what they require, without extras or
dev tools. Run it after changing [project.dependencies]; tests/test_kubernetes.py checks
the lock against pyproject.toml and the code's imports.

    .venv/bin/python scripts/lock_runtime.py
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "deploy" / "requirements.lock"


def runtime_lock() -> str:
    # Both distributions: the client and the servers (which require the client, itself
    # installed from source in the image, not from the lock).
    deps = [
        d
        for project in (ROOT / "pyproject.toml", ROOT / "services" / "pyproject.toml")
        for d in tomllib.loads(project.read_text())["project"]["dependencies"]
    ]
    pending = [
        Requirement(d) for d in deps if canonicalize_name(Requirement(d).name) != "lightpath"
    ]
    pinned: dict[str, str] = {}
    while pending:
        req = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in pinned:
            continue
        dist = md.distribution(req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{req.name} {dist.version} does not satisfy {req}: reinstall .venv")
        pinned[name] = dist.version
        pending.extend(Requirement(r) for r in dist.requires or [])
    lines = [
        "# Every package the Lightpath image runs, at exact versions (deploy/Dockerfile",
        "# installs these with --no-deps, then checks them with `pip check`).",
        "# Written by `python scripts/lock_runtime.py` from .venv; run it after",
        "# changing [project.dependencies]. tests/test_kubernetes.py checks it.",
        f"# python: {sys.version_info.major}.{sys.version_info.minor} {sys.platform}"
        " (markers were evaluated for this; the image's base must match)",
        *(f"{n}=={v}" for n, v in sorted(pinned.items())),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    LOCK.write_text(runtime_lock())
    print(f"wrote {LOCK.relative_to(ROOT)}")
