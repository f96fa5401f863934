"""Where the local stack keeps its state (Redis data, logs, certificates, audit log).

Which stack a command uses, first that applies (`state_dir_and_source`):
  1. `--state-dir DIR` (the CLI sets LIGHTPATH_STATE_DIR for the command) or
     LIGHTPATH_STATE_DIR;
  2. the context in use (lightpath.config: `--context`, LIGHTPATH_CONTEXT, else the
     config file's current_context, which `lightpath up` sets), when it has a state_dir;
  3. `.lightpath` in the current directory.
`lightpath up` itself starts its stack in 1, else 3 (`local_state_dir`), and records it
as the current context.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

# What set LIGHTPATH_STATE_DIR, when the CLI did it for a flag ("--state-dir"): messages
# then name the flag the user typed.
STATE_DIR_FLAG: list[str] = []


def default_state_dir() -> Path:
    return state_dir_and_source()[0]


def local_state_dir() -> Path:
    """The directory `lightpath up` starts a stack in: LIGHTPATH_STATE_DIR, else .lightpath."""
    return Path(os.environ.get("LIGHTPATH_STATE_DIR") or ".lightpath").resolve()


def state_dir_and_source() -> tuple[Path, str]:
    """The local stack's directory (see the module docstring) and where it came from, in
    words for messages: "--state-dir", "LIGHTPATH_STATE_DIR", "context local in
    ~/.config/lightpath/config.toml", "the current directory"."""
    if os.environ.get("LIGHTPATH_STATE_DIR"):
        source = STATE_DIR_FLAG[-1] if STATE_DIR_FLAG else "LIGHTPATH_STATE_DIR"
        return Path(os.environ["LIGHTPATH_STATE_DIR"]).resolve(), source
    from lightpath.config import current_context

    context = current_context()
    if context is not None and context.state_dir:
        return Path(context.state_dir), f"context {context.name} in {context.path}"
    return Path(".lightpath").resolve(), "the current directory"


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
