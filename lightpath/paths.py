"""Where the local stack keeps its state (Redis data, logs, certificates, audit log)."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    return Path(os.environ.get("LIGHTPATH_STATE_DIR", ".lightpath")).resolve()


def pki_dir(state_dir: Path | None = None) -> Path:
    return (state_dir or default_state_dir()) / "pki"
