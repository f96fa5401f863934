"""Contexts: named remote stacks (addresses and credentials) in a config file, so a
command or an SDK client reaches a remote cell without an address setting each time.

    # ~/.config/lightpath/config.toml  (or $LIGHTPATH_CONFIG)
    current_context = "prod"

    [contexts.prod]
    tls_ca = "/etc/lightpath/ca.crt"          # the CA to trust
    tls_cert = "/home/me/.lightpath/me.crt"   # your certificate and key (optional)
    tls_key = "/home/me/.lightpath/me.key"
    token_file = "/home/me/.lightpath/token"  # a bearer token (optional)

    [contexts.prod.addresses]                 # by the local stack's process names
    cell-scheduler = "cell.prod.example:443"
    core-broker = "broker.prod.example:443"
    agg-root = "agg.prod.example:443"

    [contexts.local]                          # written by `lightpath up`
    state_dir = "/home/me/src/lightpath/.lightpath"

The context in use: `lightpath --context NAME`, else $LIGHTPATH_CONTEXT, else the
file's `current_context`; none when the file names none. `lightpath up` records the
stack it starts as the context `local` (or the `--context` it was given) with its
`state_dir` and makes it the current one, so every later command, from any directory,
finds that stack (its stack.json and pki/), as kubectl finds its cluster.
An address setting (LIGHTPATH_CELL_ADDR, ...) still wins over the context's address,
and LIGHTPATH_TLS_* / LIGHTPATH_TOKEN* over its credentials; --state-dir and
LIGHTPATH_STATE_DIR over its state_dir.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_CONTEXT = "local"  # the context `lightpath up` records its stack as, by default


class ConfigError(RuntimeError):
    """The config file cannot be read, or names a context it does not have."""


@dataclass(frozen=True)
class Context:
    name: str
    path: Path  # the file it is in
    addresses: dict[str, str] = field(default_factory=dict)
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    token_file: str = ""
    state_dir: str = ""  # a local stack's directory (`lightpath up` writes it)

    @property
    def has_credentials(self) -> bool:
        return bool(self.tls_ca or self.tls_cert or self.token_file)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("LIGHTPATH_CONFIG"):
        return Path(env["LIGHTPATH_CONFIG"])
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "lightpath" / "config.toml"


_STRING_KEYS = ("tls_ca", "tls_cert", "tls_key", "token_file")


def load_contexts(path: Path) -> tuple[str, dict[str, Context]]:
    """The file's current_context and its contexts; ("", {}) when there is no file."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return "", {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from None
    contexts = {}
    for name, raw in (data.get("contexts") or {}).items():
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: contexts.{name} must be a table")
        known = {"addresses", "state_dir", *_STRING_KEYS}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(
                f"{path}: contexts.{name} has {', '.join(unknown)}; it may have "
                + ", ".join(sorted(known))
            )
        contexts[name] = Context(
            name,
            path,
            {str(k): str(v) for k, v in (raw.get("addresses") or {}).items()},
            *(str(raw.get(k, "")) for k in (*_STRING_KEYS, "state_dir")),
        )
    return str(data.get("current_context", "")), contexts


def current_context(environ: Mapping[str, str] | None = None) -> Context | None:
    """The context in use (see the module docstring), None without one."""
    env = os.environ if environ is None else environ
    path = config_path(env)
    current, contexts = load_contexts(path)
    name = env.get("LIGHTPATH_CONTEXT") or current
    if not name:
        return None
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise ConfigError(f"no context {name!r} in {path} (it has: {known})")
    return contexts[name]


def save_local_context(
    name: str, state_dir: Path, environ: Mapping[str, str] | None = None
) -> Path:
    """Record the local stack in `state_dir` as the context `name` of the user's config file
    and make it the current context (what `lightpath up` does); the file's other contexts
    are kept (its comments are not: the file is written anew). The file's path."""
    path = config_path(environ)
    _, contexts = load_contexts(path)
    old = contexts.get(name) or Context(name, path)
    contexts[name] = dataclasses.replace(old, path=path, state_dir=str(state_dir))
    lines = [f"current_context = {_toml_string(name)}"]
    for c in sorted(contexts.values(), key=lambda c: c.name):
        lines += ["", f"[contexts.{_toml_key(c.name)}]"]
        for k in (*_STRING_KEYS, "state_dir"):
            if getattr(c, k):
                lines.append(f"{k} = {_toml_string(getattr(c, k))}")
        if c.addresses:
            lines += ["", f"[contexts.{_toml_key(c.name)}.addresses]"]
            lines += [f"{_toml_key(k)} = {_toml_string(v)}" for k, v in sorted(c.addresses.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def _toml_string(value: str) -> str:
    import json

    return json.dumps(value)  # a JSON string is a TOML basic string


def _toml_key(key: str) -> str:
    return key if key and all(ch.isalnum() or ch in "-_" for ch in key) else _toml_string(key)
