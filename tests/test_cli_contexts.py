"""The CLI finds the stack the way kubectl finds its cluster (issue 33, item 2): `lightpath
up` records its stack as the user's current context (in the config file, not the current
directory), `--context` / LIGHTPATH_CONTEXT / `--state-dir` choose another, the global
flags go before any command, and a missing stack is named with where it was looked for.
On a real `lightpath up`, with the CLI run as a user runs it (a process, another cwd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from lightpath.cli import main

# One stack for the module: its tests share a worker (else each worker starts its own).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-contexts")]
_SCRIPT = Path(sys.executable).parent / "lightpath"
LIGHTPATH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lightpath"]


def _env(config: Path, **more: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LIGHTPATH_REDIS_URL", "LIGHTPATH_STATE_DIR", "LIGHTPATH_CONTEXT")
        and not k.startswith("LIGHTPATH_TLS_")
        and not k.endswith("_ADDR")
    }
    return {**env, "LIGHTPATH_CONFIG": str(config), **more}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """`lightpath up` run in one directory (no --state-dir); yields (config, state dir)."""
    home = tmp_path_factory.mktemp("started-here")
    config = tmp_path_factory.mktemp("user-config") / "lightpath" / "config.toml"
    proc = subprocess.Popen(
        [*LIGHTPATH, "up", "--ephemeral-ports", "--no-console"],
        cwd=home,
        env=_env(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    state_dir = home / ".lightpath"
    deadline = time.monotonic() + 120
    while not (config.exists() and (state_dir / "stack.json").exists()):
        if proc.poll() is not None:
            pytest.fail(f"lightpath up exited {proc.returncode}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, "the stack did not come up"
        time.sleep(0.2)
    try:
        yield config, state_dir
    finally:
        proc.terminate()
        proc.wait(60)


def run(config: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LIGHTPATH, *args],
        cwd=cwd,
        env=_env(config, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_up_makes_its_stack_the_current_context(stack):
    config, state_dir = stack
    data = tomllib.loads(config.read_text())
    assert data["current_context"] == "local"
    assert data["contexts"]["local"]["state_dir"] == str(state_dir)


def test_commands_from_another_directory_find_the_stack(stack, tmp_path):
    config, _ = stack
    status = run(config, tmp_path, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["running"] is True
    jobs = run(config, tmp_path, "jobs", "-o", "json")
    assert jobs.returncode == 0, jobs.stderr
    assert json.loads(jobs.stdout)["jobs"] == []
    assert not (tmp_path / ".lightpath").exists()
    listed = run(config, tmp_path, "contexts", "-o", "json")
    assert json.loads(listed.stdout)["current_context"] == "local"


def test_global_flags_go_before_any_command(stack, tmp_path):
    config, state_dir = stack
    for args in (
        ["--state-dir", str(state_dir), "jobs"],
        ["-o", "json", "--state-dir", str(state_dir), "pods"],
        ["--context", "local", "-o", "yaml", "jobs"],
        ["--json", "pods"],
    ):
        done = run(config, tmp_path, *args)
        assert done.returncode == 0, (args, done.stderr)
    assert json.loads(run(config, tmp_path, "-o", "json", "pods").stdout)["pods"]
    submitted = run(
        config,
        tmp_path,
        "--state-dir",
        str(state_dir),
        "submit",
        "ctx-1",
        "--shape",
        "1x1x1",
        "--blocks",
    )
    assert submitted.returncode == 0, submitted.stderr
    assert run(config, tmp_path, "--json", "job", "ctx-1").returncode == 0


def test_a_missing_stack_is_named_with_where_it_was_looked_for(stack, tmp_path):
    config, _ = stack
    empty = tmp_path / "empty"
    by_flag = run(config, tmp_path, "--state-dir", str(empty), "jobs")
    assert by_flag.returncode == 1
    assert f"no stack at {empty} (--state-dir); start one with `lightpath up`" in by_flag.stderr
    assert "UNAVAILABLE" not in by_flag.stderr  # no default port dialled
    by_env = run(config, tmp_path, "status", LIGHTPATH_STATE_DIR=str(empty))
    assert f"no stack at {empty} (LIGHTPATH_STATE_DIR)" in by_env.stdout

    other = tmp_path / "other-config.toml"
    other.write_text(
        config.read_text() + f'\n[contexts.lab]\nstate_dir = "{empty}"\n', encoding="utf-8"
    )
    by_context_env = run(other, tmp_path, "jobs", LIGHTPATH_CONTEXT="lab")
    assert f"no stack at {empty} (context lab in {other})" in by_context_env.stderr
    by_context_flag = run(other, tmp_path, "pods", "--context", "lab")
    assert f"(context lab in {other})" in by_context_flag.stderr
    # --context on the command line wins over LIGHTPATH_STATE_DIR of the shell
    back = run(other, tmp_path, "--context", "local", "jobs", LIGHTPATH_STATE_DIR=str(empty))
    assert back.returncode == 0, back.stderr
    unknown = run(config, tmp_path, "--context", "nope", "jobs")
    assert unknown.returncode == 2 and "no context 'nope'" in unknown.stderr


def test_without_any_stack_the_current_directory_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIGHTPATH_STATE_DIR", raising=False)
    monkeypatch.delenv("LIGHTPATH_CELL_ADDR", raising=False)
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert f"no stack at {tmp_path / '.lightpath'} (the current directory)" in err
    assert main(["status"]) == 1
    assert "start one with `lightpath up`" in capsys.readouterr().out
