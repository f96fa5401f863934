"""Where the local stack keeps its state (Redis data, logs, certificates, audit log)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


def default_state_dir() -> Path:
    return Path(os.environ.get("LIGHTPATH_STATE_DIR", ".lightpath")).resolve()


def pki_dir(state_dir: Path | None = None) -> Path:
    return (state_dir or default_state_dir()) / "pki"


def write_private(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` readable by its owner only (0600), whole or not at all
    (a temporary file renamed over it); the folder is made when missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def open_private_append(path: Path) -> BinaryIO:
    """`path` opened to append bytes, readable by its owner only (0600), also when it
    existed with wider permissions (a log kept from an older release)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")
