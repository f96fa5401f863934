"""`lightpath up` as a user runs it: a subprocess that starts Redis and every
service, reports them healthy, and leaves no process behind when stopped."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from lightpath.stack import default_topology

pytestmark = pytest.mark.slow
# The console script a user types, installed next to this interpreter.
_SCRIPT = Path(sys.executable).parent / "lightpath"
LIGHTPATH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lightpath"]


def _user_env() -> dict[str, str]:
    """A user's shell: no Redis of the tests, no certificates of the test CA (the stack
    makes its own, and the CLI finds them in the state directory)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "LIGHTPATH_REDIS_URL" and not k.startswith("LIGHTPATH_TLS_")
    }


def _start_up(state_dir: Path) -> subprocess.Popen[str]:
    env = _user_env()
    return subprocess.Popen(
        [*LIGHTPATH, "up", "--ephemeral-ports", "--state-dir", str(state_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_stack(proc: subprocess.Popen[str], state_dir: Path, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while not (state_dir / "stack.json").exists():
        if proc.poll() is not None:
            pytest.fail(f"lightpath up exited {proc.returncode}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, "stack did not come up"
        time.sleep(0.2)
    return json.loads((state_dir / "stack.json").read_text())


def _status(state_dir: Path) -> tuple[int, dict]:
    out = subprocess.run(
        [*LIGHTPATH, "status", "--json", "--state-dir", str(state_dir)],
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _loopback(ip: str) -> bool:
    """127.0.0.1, ::1, or gRPC's dual-stack form of 127.0.0.1 (::ffff:127.0.0.1)."""
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _assert_all_gone(procs: list[psutil.Process], timeout: float = 15) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"


def test_up_serves_every_service_and_ctrl_c_leaves_nothing_behind(tmp_path):
    proc = _start_up(tmp_path)
    try:
        state = _wait_for_stack(proc, tmp_path)
        assert set(state["endpoints"]) == {s.name for s in default_topology()}
        code, status = _status(tmp_path)
        assert code == 0 and status["running"]
        assert {s["health"] for s in status["services"].values()} == {"SERVING"}
        assert status["security"]["tls"] is True
        children = _descendants(proc.pid)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        # every service, and the web console (issue 21), each its own process
        assert "redis-server" in names and names.count("services.") == len(default_topology()) + 1
        assert "lightpath_services.console" in names
        assert status["console"]["url"] == state["console"]
        assert state["console"].startswith("https://127.0.0.1:")
        assert status["console"]["health"] == "SERVING"
        # secure by default: everything listens on loopback only, Redis needs its
        # password, and the password is in no process's arguments
        listening = [
            conn.laddr.ip
            for c in children
            for conn in c.net_connections(kind="tcp")
            if conn.status == psutil.CONN_LISTEN
        ]
        assert len(listening) >= len(default_topology()) + 1
        assert all(_loopback(ip) for ip in listening), listening
        password = (tmp_path / "secrets" / "redis.password").read_text().strip()
        assert password and password not in names
        assert (tmp_path / "secrets" / "redis.password").stat().st_mode & 0o077 == 0
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(state["redis_url"]).get("x")
        assert password not in json.dumps(state)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "stack stopped" in out
        _assert_all_gone(children)
        assert not (tmp_path / "stack.json").exists()
        assert (tmp_path / "redis" / "appendonly.aof").exists() or any(
            (tmp_path / "redis").glob("appendonly*")
        )
        code, status = _status(tmp_path)
        assert code == 1 and status["running"] is False and status["services"] == {}
        assert status["state_dir"] == str(tmp_path) and status["state_dir_source"] == "--state-dir"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_supervisor_takes_its_children_with_it(tmp_path):
    proc = _start_up(tmp_path)
    try:
        _wait_for_stack(proc, tmp_path)
        children = _descendants(proc.pid)
        assert len(children) == len(default_topology()) + 2  # redis, services, console
        proc.kill()  # SIGKILL: no chance to clean up; the kernel's parent-death signal must
        proc.wait()
        _assert_all_gone(children)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ephemeral_ports_are_never_handed_out_twice_across_processes(tmp_path):
    """Two processes picking at once (the suite's parallel workers, two stacks started side
    by side) never get the same port: each pick is claimed where both look, under a lock.
    From a range of 60 ports, 25 picks each would collide almost surely otherwise."""
    import random

    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from lightpath import embedded_redis as er\n"
        "er._CLAIMS_DIR = Path(sys.argv[1])\n"
        "er._PICK_RANGE = (int(sys.argv[2]), int(sys.argv[2]) + 59)\n"
        "sys.stdin.read()\n"  # both start picking together
        "print(json.dumps([er.free_port() for _ in range(25)]))\n"
    )
    base = random.SystemRandom().randrange(20000, 32000, 100)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "claims"), str(base)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate("go", timeout=60)[0] for p in procs]
    a, b = (json.loads(o) for o in outs)
    assert len(set(a)) == len(set(b)) == 25
    assert not set(a) & set(b)


def test_ephemeral_ports_of_one_process_are_never_handed_out_twice():
    """A pick is bound by its process only later, so picks must differ among themselves: a
    stack's ~25 picks from the range below the kernel's once collided ("Failed to bind")."""
    from lightpath.embedded_redis import free_port
    from lightpath.stack import with_ephemeral_ports

    picks = [free_port() for _ in range(400)]
    assert len(set(picks)) == len(picks)
    specs = with_ephemeral_ports(default_topology(switch_agents=True))
    ports = [p for s in specs for p in (s.port, s.metrics_port) if p]
    assert len(set(ports)) == len(ports) and not set(ports) & set(picks)


# A process whose gRPC threads are busy spawns short children the way the Stack and
# EmbeddedRedis spawn theirs, and counts the ones that did not exit 0.
_SPAWN_UNDER_GRPC = """
import asyncio, subprocess, sys, threading
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from lightpath.embedded_redis import dies_with_parent

ready = threading.Event()

async def busy():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stub = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    while True:
        await stub.Check(health_pb2.HealthCheckRequest())
        ready.set()

threading.Thread(target=lambda: asyncio.run(busy()), daemon=True).start()
ready.wait(30)
bad = 0
for _ in range(int(sys.argv[1])):
    child = subprocess.Popen(
        dies_with_parent(["true"]), start_new_session=True, stderr=subprocess.DEVNULL
    )
    bad += child.wait() != 0
print(bad)
"""


def test_children_spawned_while_grpc_runs_all_start():
    """With a Python pre-exec hook (the death signal set between fork and exec), about one
    child in five of a process running gRPC aborted before its exec (grpc/grpc#43055:
    gRPC's fork handlers restart its poller in the child, and close_fds closes the
    poller's epoll descriptor); CI saw a service "exit with code -6" at start."""
    out = subprocess.run(
        [sys.executable, "-c", _SPAWN_UNDER_GRPC, "200"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", out.stdout


def test_redis_is_spawned_with_no_python_between_fork_and_exec(tmp_path, monkeypatch):
    from lightpath import embedded_redis

    seen: list[dict] = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        seen.append({"argv": args[0], **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    server = embedded_redis.EmbeddedRedis(tmp_path / "redis", appendonly=False)
    server.start()
    try:
        assert redis.Redis(port=server.port).ping()
    finally:
        server.stop()
    assert seen and all(s.get("preexec_fn") is None for s in seen), seen
    if sys.platform.startswith("linux") and shutil.which("setpriv"):
        assert all(s["argv"][1:3] == ["--pdeathsig", "TERM"] for s in seen), seen
