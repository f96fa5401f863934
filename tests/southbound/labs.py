"""Real switches' management interfaces for the southbound tests (issue 34): a SONiC OCS is
a real redis-server (its CONFIG_DB and STATE_DB) with the orchagent emulator on it; a
Polatis-style switch is a NETCONF server over SSH (its own process). One per OCS."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lightpath.domain.southbound import OCS, devices
from lightpath.domain.switch_timing import SwitchTiming
from lightpath.domain.torus import Fabric
from lightpath.embedded_redis import EmbeddedRedis, free_port, stop_process
from lightpath_services.ocs_manager.device_switch import PortSides
from lightpath_services.switch_emulators.polatis import write_host_key
from lightpath_services.switch_emulators.sonic import OrchagentEmulator

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SonicSwitchLab:
    """One emulated SONiC OCS: its redis-server and orchagent."""

    switch_id: str
    server: EmbeddedRedis
    orchagent: OrchagentEmulator

    @property
    def url(self) -> str:
        return f"sonic://127.0.0.1:{self.server.port}"

    async def restart_empty(self) -> None:
        """Power cycle: Redis comes back empty (a new run id), orchagent starts again."""
        await self.orchagent.stop()
        self.server.stop()
        self.server.start()
        await self.orchagent.start()


@dataclass
class SonicLab:
    switches: dict[str, SonicSwitchLab] = field(default_factory=dict)

    def switch_map(self) -> str:
        """LIGHTPATH_OCS_SWITCHES naming every emulated switch."""
        return ",".join(f"{sid}={s.url}" for sid, s in self.switches.items())

    def __getitem__(self, switch_id: str) -> SonicSwitchLab:
        return self.switches[switch_id]


@contextlib.asynccontextmanager
async def sonic_lab(
    fabric: Fabric,
    workdir: Path,
    *,
    timing: SwitchTiming | None = None,
    only: set[str] | None = None,
    spare_ports: int = 2,
    short: set[str] = frozenset(),  # type: ignore[assignment]
) -> AsyncIterator[SonicLab]:
    """A SONiC OCS per OCS of `fabric` (or of `only`), each with the ports the fabric
    cables plus `spare_ports` on each side."""
    lab = SonicLab()
    try:
        for d in devices(fabric):
            if d.kind != OCS or (only is not None and d.id not in only):
                continue
            sides = PortSides.of(fabric, d)
            server = EmbeddedRedis(workdir / f"sonic-{d.id}", port=free_port(), appendonly=False)
            server.start()
            orch = OrchagentEmulator(
                f"redis://127.0.0.1:{server.port}",
                sides.first_ends + spare_ports,
                sides.second_ends + (-1 if d.id in short else spare_ports),
                timing=timing or SwitchTiming.fixed(1.0),
            )
            lab.switches[d.id] = SonicSwitchLab(d.id, server, orch)
            await orch.start()
        yield lab
    finally:
        for s in lab.switches.values():
            with contextlib.suppress(Exception):
                await s.orchagent.stop()
            s.server.stop()


@dataclass
class NetconfLab:
    """Polatis-style switches: one NETCONF-over-SSH server process serving each OCS on
    its own port, with a known_hosts file pinning its host key."""

    proc: subprocess.Popen[bytes]
    addresses: dict[str, int]  # switch id -> port
    ports: int  # N of each N x N switch
    known_hosts: Path
    password_file: Path
    log: Path
    host_key: Path

    def url(self, switch_id: str) -> str:
        return f"netconf://admin@127.0.0.1:{self.addresses[switch_id]}"

    def switch_map(self) -> str:
        return ",".join(f"{sid}={self.url(sid)}" for sid in self.addresses)

    def settings(self) -> dict[str, str]:
        """The manager's settings for these switches."""
        return {
            "LIGHTPATH_OCS_SWITCHES": self.switch_map(),
            "LIGHTPATH_OCS_NETCONF_PASSWORD_FILE": str(self.password_file),
            "LIGHTPATH_OCS_NETCONF_KNOWN_HOSTS": str(self.known_hosts),
        }

    def stop(self) -> None:
        stop_process(self.proc)


def start_netconf(
    ids: list[str],
    ports: int,
    workdir: Path,
    *,
    timing: str = "fixed:1",
    reuse: NetconfLab | None = None,
    keys_from: NetconfLab | None = None,
) -> NetconfLab:
    """The NETCONF server process for switches `ids` (N x N, N = `ports`), on fresh ports
    (or `reuse`'s, to bring the same switches back empty after a kill; `keys_from`: with
    that lab's host key, known_hosts and password)."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "host_key"
    known = workdir / "known_hosts"
    secret = workdir / "password"
    if reuse is not None:
        key, known, secret = reuse.host_key, reuse.known_hosts, reuse.password_file
        addresses = reuse.addresses
    elif keys_from is not None:
        key, known, secret = keys_from.host_key, keys_from.known_hosts, keys_from.password_file
        public = known.read_text().splitlines()[0].split(maxsplit=1)[1]
        addresses = {sid: free_port() for sid in ids}
        with known.open("a") as f:
            f.write("".join(f"[127.0.0.1]:{port} {public}\n" for port in addresses.values()))
    else:
        public = write_host_key(key)
        addresses = {sid: free_port() for sid in ids}
        known.write_text("".join(f"[127.0.0.1]:{port} {public}\n" for port in addresses.values()))
        secret.write_text("s3cret-" + os.urandom(4).hex())
    log = workdir / "polatis.log"
    args = [
        sys.executable,
        "-m",
        "lightpath_services.switch_emulators.polatis",
        "--ports",
        str(ports),
    ]
    args += ["--host-key", str(key), "--timing", timing]
    for sid, port in addresses.items():
        args += ["--switch", f"{sid}=127.0.0.1:{port}"]
    env = {**os.environ, "POLATIS_PASSWORD": secret.read_text(), "PYTHONPATH": str(ROOT)}
    with log.open("ab") as err:
        proc = subprocess.Popen(
            args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if b"ready" not in line:
        proc.kill()
        raise RuntimeError("the NETCONF server did not start:\n" + log.read_text()[-3000:])
    return NetconfLab(proc, addresses, ports, known, secret, log, key)


@contextlib.contextmanager
def netconf_lab(
    fabric: Fabric, workdir: Path, *, timing: str = "fixed:1", only: set[str] | None = None
) -> Iterator[NetconfLab]:
    ids = [d.id for d in devices(fabric) if d.kind == OCS and (only is None or d.id in only)]
    ports = max(max(fabric.first_ends), fabric.block_count) + 2
    lab = start_netconf(ids, ports, workdir, timing=timing)
    try:
        yield lab
    finally:
        lab.stop()
