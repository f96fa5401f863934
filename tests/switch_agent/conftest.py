"""Real switch agents (`python -m lightpath_services.switch_agent` processes) for the southbound tests,
and an ocs_manager driving them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.security.identity import service_principal
from lightpath.stack import health_status
from lightpath.v1 import ocs_manager_pb2_grpc, optical_switch_pb2_grpc
from lightpath.v1 import optical_switch_pb2 as sb
from tests.helpers import credentials, serve, tls_env

ROOT = Path(__file__).resolve().parents[2]
POD = "pod-sb"


def fabric(blocks: int = 8, k: int = 1) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": POD,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "2x2x2",
        "LIGHTPATH_FABRIC_BLOCKS": str(blocks),
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
        "LIGHTPATH_FABRIC_OCS_RADIX": str(2 * blocks + 8),
    }


class ServiceProcess:
    """`python -m services.<service>` on a fixed port (so it can be killed and started again),
    with its own certificate from the test CA."""

    service = "switch_agent"
    prefix: tuple[str, ...] = ()  # what the command runs under (`ip netns exec NS`)

    def __init__(
        self,
        redis_url: str,
        workdir: Path,
        env: dict[str, str],
        *,
        host: str = "127.0.0.1",
        tls: dict[str, str] | None = None,
    ):
        self.port = free_port()
        self.address = f"{host}:{self.port}"
        self.workdir = workdir
        self.env = {
            **os.environ,
            **(
                tls
                if tls is not None
                else tls_env(service_principal(self.service, env.get("LIGHTPATH_POD_ID", POD)))
            ),
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": self.address,
            "LIGHTPATH_AUDIT_LOG": "",
            "LIGHTPATH_LOG_FORMAT": "text",
            "LIGHTPATH_SHUTDOWN_GRACE_S": "0.2",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.proc: subprocess.Popen | None = None
        self.log = workdir / f"{self.service}-{self.port}.log"

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", f"lightpath_services.{self.service}"],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        deadline = time.monotonic() + timeout
        # A TLS health call only once the port takes connections: while the process
        # imports, each would cost a channel and a refused connect for nothing.
        while not _accepting(self.address) or health_status(self.address, timeout=0.5) != "SERVING":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(
                    f"{self.service} did not start:\n" + self.log.read_text()[-3000:]
                )
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _accepting(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


class AgentProcess(ServiceProcess):
    service = "switch_agent"


class ManagerProcess(ServiceProcess):
    service = "ocs_manager"


@contextlib.contextmanager
def agent_process(redis_url: str, workdir: Path, **env: str) -> Iterator[AgentProcess]:
    agent = AgentProcess(redis_url, workdir, env)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@contextlib.asynccontextmanager
async def admin(address: str) -> AsyncIterator[optical_switch_pb2_grpc.OpticalSwitchAdminStub]:
    """The operator's fault-injection stub (the tests' default identity is the operator)."""
    async with channel(address, max_attempts=1) as ch:
        yield optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch)


@contextlib.asynccontextmanager
async def as_manager(address: str) -> AsyncIterator[optical_switch_pb2_grpc.OpticalSwitchStub]:
    """The southbound stub as the pod's ocs_manager (the role that may program switches)."""
    async with channel(
        address, max_attempts=1, credentials=credentials(f"service:ocs_manager/{POD}")
    ) as ch:
        yield optical_switch_pb2_grpc.OpticalSwitchStub(ch)


async def inject(address: str, switch_id: str, **faults) -> None:
    async with admin(address) as a:
        await a.InjectFault(
            sb.InjectFaultRequest(switch_id=switch_id, faults=sb.SwitchFaults(**faults))
        )


async def apply_calls(address: str) -> int:
    async with admin(address) as a:
        return (await a.GetSwitchStats(sb.GetSwitchStatsRequest())).apply_calls


def manager_env(agent: AgentProcess, **extra: str) -> dict[str, str]:
    return {
        **fabric(),
        "LIGHTPATH_OCS_SWITCH_AGENTS": agent.address,
        "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "2",
        "LIGHTPATH_OCS_CHANGE_LEASE_S": "6",
        "LIGHTPATH_OCS_RECONCILE_S": "0.2",
        **extra,
    }


@contextlib.asynccontextmanager
async def manager(
    redis_url: str, agent: AgentProcess, **extra: str
) -> AsyncIterator[ocs_manager_pb2_grpc.OcsManagerStub]:
    """The pod's ocs_manager in-process, driving `agent`'s switches."""
    async with (
        serve("ocs_manager", redis_url, manager_env(agent, **extra)) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch)
