"""`lightpath down` and `lightpath logs` (issue 33, item 7) on a real `lightpath up`, and
gRPC's C-core chatter kept off the CLI's stderr unless -v."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from threading import Thread

import psutil
import pytest

from lightpath.embedded_redis import free_port

# One stack for the module: its tests share a worker (else each worker starts its own).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-lifecycle")]
_SCRIPT = Path(sys.executable).parent / "lightpath"
LIGHTPATH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lightpath"]


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


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("lifecycle")
    proc = subprocess.Popen(
        [*LIGHTPATH, "up", "--ephemeral-ports", "--no-console", "--state-dir", str(state_dir)],
        env=_user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (state_dir / "stack.json").exists():
        if proc.poll() is not None:
            pytest.fail(f"lightpath up exited {proc.returncode}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, "the stack did not come up"
        time.sleep(0.2)
    try:
        yield proc, state_dir
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


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
