"""Shared by the benchmarks: percentiles, a private Redis, the services' certificates,
a private stack, the one-JSON-line output.

Benchmarks are not tests: they print what they measure and never assert a time.
They run the services as users do: TLS with client certificates (mTLS), the bench
calling as the operator with an explicit `Credentials` (never `Credentials.default()`,
which would pick up whatever the environment or a running `lightpath up` offers).
Run one with `python3 dev.py bench NAME`.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightpath.embedded_redis import EmbeddedRedis

if TYPE_CHECKING:
    from lightpath.security.credentials import Credentials
    from lightpath.security.identity import Principal
    from lightpath.security.pki import LocalCA
    from lightpath.stack import ProcessSpec, Stack


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `samples`."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A real redis-server on a free port for the benchmark's lifetime (AOF off, like the tests)."""
    with (
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
        EmbeddedRedis(tmp, appendonly=False) as server,
    ):
        yield server.url


def bench_ca(directory: str | Path) -> LocalCA:
    """A local CA under `directory` for services a bench starts itself (made on first use)."""
    from lightpath.security.pki import LocalCA

    return LocalCA(Path(directory)).ensure()


def service_tls_env(ca: LocalCA, principal: Principal) -> dict[str, str]:
    """The LIGHTPATH_TLS_* variables of a service process whose identity is `principal`
    (mTLS, client certificates required: the services' default)."""
    files = ca.issue(principal)
    return {
        "LIGHTPATH_TLS_CERT": str(files.cert),
        "LIGHTPATH_TLS_KEY": str(files.key),
        "LIGHTPATH_TLS_CA": str(files.ca),
        "LIGHTPATH_PLAINTEXT": "false",
    }


def operator_credentials(ca: LocalCA) -> Credentials:
    """The operator's client certificate from `ca`: what the bench's channels present."""
    from lightpath.security.credentials import Credentials
    from lightpath.security.identity import OPERATOR, Principal

    files = ca.issue(Principal(OPERATOR, OPERATOR))
    return Credentials.from_files(files.ca, files.cert, files.key, source="bench operator")


def source_path(root: Path) -> str:
    """PYTHONPATH that runs both distributions from the source tree `root`: the client
    (`lightpath`, at its top) and the services (`lightpath_services`, under services/).
    Without the second, another checkout's processes would import this tree's services
    through its editable install."""
    import os

    return os.pathsep.join((str(root), str(root / "services")))


def start_service(
    service: str,
    principal: Principal,
    ca: LocalCA,
    creds: Credentials,
    workdir: Path,
    env: dict[str, str],
    *,
    timeout: float = 60.0,
    root: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """`python -m services.<service>` as deployed (mTLS as `principal`, its audit log and
    stderr under `workdir`, `env` on top) on a free loopback port, once it is SERVING:
    (process, address). `root`: the source tree it runs from (this one; another checkout
    to compare with older code). If it does not start, the error ends with its log's tail."""
    import os
    import time

    from lightpath.embedded_redis import free_port
    from lightpath.stack import health_status

    root = root or Path(__file__).resolve().parent.parent
    port = free_port()
    name = principal.name.replace("/", "-")  # a file name (service names hold a slash)
    full_env = {
        **os.environ,
        **service_tls_env(ca, principal),
        "LIGHTPATH_AUDIT_LOG": str(workdir / f"audit-{name}.jsonl"),  # as the local stack does
        "LIGHTPATH_LISTEN": f"127.0.0.1:{port}",
        "PYTHONPATH": source_path(root),
        **env,
    }
    log = workdir / f"{service}-{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"lightpath_services.{service}"],
            env=full_env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while health_status(address, timeout=0.5, credentials=creds) != "SERVING":
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{service} ({name}) did not start:\n{tail}")
        time.sleep(0.1)
    return proc, address


@contextlib.contextmanager
def private_stack(specs: list[ProcessSpec], *, tls: bool) -> Iterator[Stack]:
    """A started `Stack` of `specs` on its own private Redis and temporary state dir:
    TLS with per-process certificates (`tls` True) or plaintext with bearer tokens.
    Its operator's credentials are `stack.operator`, its Redis `stack.redis_url`."""
    from lightpath.stack import Stack

    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp,
    ):
        stack = Stack(Path(tmp), specs=specs, redis_url=redis_url, tls=tls, log=lambda *_: None)
        stack.start()
        try:
            yield stack
        finally:
            stack.stop()


def tls_cost(with_tls: float, without_tls: float) -> float:
    """The share of a throughput that TLS costs: 1 - with / without (negative: TLS was faster)."""
    return 1.0 - with_tls / without_tls if without_tls else float("nan")


def redis_pid(url: str) -> int | None:
    """The process id of the redis-server at `url` (for CPU accounting)."""
    import redis

    with redis.Redis.from_url(url) as r:
        return int(r.info("server")["process_id"])


def cpu_seconds(procs: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) so far of each named process id; "client" is this process."""
    import os

    import psutil

    out = {}
    for name, pid in procs.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system
    t = psutil.Process(os.getpid()).cpu_times()
    out["client"] = t.user + t.system
    return out


def stack_pids(stack, redis_url: str) -> dict[str, int]:
    """Process ids of a started Stack's services and of its Redis."""
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    pid = redis_pid(redis_url)
    if pid:
        pids["redis"] = pid
    return pids


def cpu_ms_per(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """CPU ms per unit of work (n units) of each process between two `cpu_seconds` readings."""
    return {k: round((after[k] - before[k]) * 1000.0 / max(1, n), 2) for k in after}


def emit(result: dict) -> None:
    """Print the benchmark's result as one JSON line (floats rounded for people)."""

    def tidy(v):
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, dict):
            return {k: tidy(x) for k, x in v.items()}
        return v

    print(json.dumps(tidy(result), sort_keys=True), flush=True)
