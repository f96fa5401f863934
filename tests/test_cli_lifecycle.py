"""The CLI on a real `lightpath up`, run as a user runs it (a process, another cwd), one
stack for the module (its tests share a worker, else each worker starts its own).

Contexts (issue 33, item 2): the CLI finds the stack the way kubectl finds its cluster:
`lightpath up` records its stack as the user's current context (in the config file, not
the current directory), `--context` / LIGHTPATH_CONTEXT / `--state-dir` choose another,
the global flags go before any command, and a missing stack is named with where it was
looked for.

`lightpath logs` and `lightpath down` (issue 33, item 7), down last: it stops the stack.
And gRPC's C-core chatter kept off the CLI's stderr unless -v."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from threading import Thread

import psutil
import pytest

from lightpath.cli import main
from lightpath.embedded_redis import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-lifecycle")]
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


def _user_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("LIGHTPATH_REDIS_URL", "GRPC_VERBOSITY") and not k.startswith("LIGHTPATH_TLS_")
    }


def cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LIGHTPATH, *args],
        env={**_user_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run(config: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LIGHTPATH, *args],
        cwd=cwd,
        env=_env(config, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def _up(tmp_path_factory):
    """`lightpath up` run in one directory (no --state-dir), with a config file of its own;
    yields (its process, the config, the state dir). The contexts' tests and the logs'
    share it (one stack started instead of two); `down`'s test stops it, last."""
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
        yield proc, config, state_dir
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


@pytest.fixture
def stack(_up):
    """(the config that names the stack, its state dir)"""
    _, config, state_dir = _up
    return config, state_dir


@pytest.fixture
def up(_up):
    """(the `lightpath up` process, its state dir)"""
    proc, _, state_dir = _up
    return proc, state_dir


# -- contexts ---------------------------------------------------------------------------


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


# -- logs and down (down last: it stops the stack) ------------------------------------


def test_logs_of_one_process_and_of_all(up):
    _, state_dir = up
    one = cli("logs", "cell-scheduler", "--state-dir", str(state_dir))
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() and "cell-scheduler" not in one.stdout.splitlines()[0][:16]
    every = cli("logs", "--state-dir", str(state_dir))
    assert every.returncode == 0, every.stderr
    prefixes = {line.split()[0] for line in every.stdout.splitlines() if line.strip()}
    assert {"cell-scheduler", "ws-pod-1", "ocs-pod-1", "core-broker"} <= prefixes
    as_json = cli("logs", "--state-dir", str(state_dir), "--json", "--tail", "5")
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(rows) == 5 and all(r["process"] and r["msg"] for r in rows)
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)  # merged in time order


def test_logs_names_the_processes_it_knows(up):
    _, state_dir = up
    out = cli("logs", "no-such-process", "--state-dir", str(state_dir))
    assert out.returncode != 0
    assert "no-such-process" in out.stderr and "cell-scheduler" in out.stderr


def test_logs_of_one_trace_across_processes(up):
    """The lines of one trace, from every process that logged it (the id an error prints)."""
    _, state_dir = up
    traced: dict[str, set[str]] = {}
    for _ in range(100):  # the services may write their traced lines a little later
        traced = {}
        for path in (state_dir / "logs").glob("*.log"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record.get("trace_id"):
                    traced.setdefault(record["trace_id"], set()).add(path.stem)
        if traced:
            break
        cli("status", "--state-dir", str(state_dir))  # calls that log under a trace
    assert traced, "no log line carries a trace id"
    trace = max(traced, key=lambda t: len(traced[t]))
    out = cli("logs", "--trace", trace, "--json", "--state-dir", str(state_dir))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows and all(r["trace_id"] == trace for r in rows)
    # Every process seen logging it (more lines of the trace may have come since).
    assert {r["process"] for r in rows} >= traced[trace]
    none = cli("logs", "--trace", "0" * 32, "--state-dir", str(state_dir))
    assert none.returncode == 1 and "no log line of trace" in none.stderr


def test_logs_follow_prints_new_lines(up):
    _, state_dir = up
    log = state_dir / "logs" / "core-broker.log"
    follow = subprocess.Popen(
        [*LIGHTPATH, "logs", "core-broker", "-f", "--tail", "0", "--state-dir", str(state_dir)],
        env=_user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: queue.Queue[str] = queue.Queue()
    Thread(target=lambda: [printed.put(line) for line in follow.stdout], daemon=True).start()
    try:
        # A line is written, again, until `logs -f` prints one: on a loaded machine it may
        # start after the first write, which --tail 0 then rightly skips.
        for _ in range(120):
            with log.open("a") as f:
                f.write(json.dumps({"ts": "9999", "level": "info", "msg": "written meanwhile"}))
                f.write("\n")
            try:
                line = printed.get(timeout=1.0)
                break
            except queue.Empty:
                assert follow.poll() is None, follow.stderr.read()
        assert "written meanwhile" in line
    finally:
        follow.terminate()
        follow.wait(10)


def test_down_stops_the_stack_and_every_process(up):
    proc, state_dir = up
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    out = cli("down", "--state-dir", str(state_dir))
    assert out.returncode == 0, out.stderr
    assert "stack stopped" in out.stdout
    assert proc.wait(30) == 0
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, alive
    assert not (state_dir / "stack.json").exists()
    again = cli("down", "--state-dir", str(state_dir), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["stopped"] is False
    # logs outlive the stack
    assert cli("logs", "cell-scheduler", "--state-dir", str(state_dir)).returncode == 0


class _NotTls(BaseHTTPRequestHandler):
    def do_GET(self):  # pragma: no cover - the CLI speaks TLS, never HTTP
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_grpc_core_chatter_stays_off_stderr_unless_verbose(tmp_path):
    """A TLS handshake that fails: the CLI says so in its own words; gRPC's C core's
    `ssl_transport_security.cc ... Handshake failed` lines are not printed."""
    port = free_port()
    server = HTTPServer(("127.0.0.1", port), _NotTls)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = cli(
            "jobs",
            LIGHTPATH_CELL_ADDR=f"127.0.0.1:{port}",
            LIGHTPATH_STATE_DIR=str(tmp_path),
        )
    finally:
        server.shutdown()
    assert out.returncode != 0
    assert "TLS handshake failed" in out.stderr
    assert "ssl_transport_security" not in out.stderr, out.stderr
    assert ".cc:" not in out.stderr


def test_without_any_stack_the_current_directory_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIGHTPATH_STATE_DIR", raising=False)
    monkeypatch.delenv("LIGHTPATH_CELL_ADDR", raising=False)
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert f"no stack at {tmp_path / '.lightpath'} (the current directory)" in err
    assert main(["status"]) == 1
    assert "start one with `lightpath up`" in capsys.readouterr().out
