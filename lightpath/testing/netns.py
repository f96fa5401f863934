"""A "host" for fault tests and benchmarks (issue 32): a network namespace with its own
loopback, joined to this one by a veth pair with two addresses of our own (10.232.n.1
here, .2 there). A link set down is a partition in both directions with both sides
running on; nftables rules in the namespace (on its end of the pair) cut chosen ports
or drop a share of the packets. Delay is not the kernel's here (tc netem needs
sch_netem, which some kernels lack): lightpath.testing.relay holds a link's bytes in
a relay of its own. Namespaces, veth and nftables need root (`unavailable()` says why
not). Nothing here touches an address or rule it did not make.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from lightpath.embedded_redis import free_port, redis_server_binary, stop_process

ROOT = Path(__file__).resolve().parents[2]
TABLE = "lp32"  # the nftables table of our rules, in the namespace only


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None or shutil.which("nft") is None:
        return "no ip or nft command (iproute2, nftables)"
    probe = f"lp32probe{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return ""


def _free_subnet() -> int:
    """A 10.232.n.0/30 no interface here uses (test processes run side by side)."""
    for _ in range(100):
        n = random.randrange(256)
        if not _ip("-o", "addr", "show", "to", f"10.232.{n}.0/30").stdout.strip():
            return n
    raise RuntimeError("no free 10.232.n.0/30 for a namespace")


class Namespace:
    """A namespace joined to this one by a veth pair: `host_ip` here, `ip` there."""

    def __init__(self) -> None:
        n = _free_subnet()
        self.name = f"lp32-{os.getpid()}-{n}"
        self.host_dev, self.dev = f"lp32h{n}x{os.getpid() % 10000}", f"lp32n{n}"
        self.host_ip, self.ip = f"10.232.{n}.1", f"10.232.{n}.2"
        self.procs: list[subprocess.Popen] = []

    def create(self) -> None:
        steps = [
            ("netns", "add", self.name),
            ("link", "add", self.host_dev, "type", "veth", "peer", "name", self.dev),
            ("link", "set", self.dev, "netns", self.name),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_dev),
            ("link", "set", self.host_dev, "up"),
            ("-n", self.name, "addr", "add", f"{self.ip}/30", "dev", self.dev),
            ("-n", self.name, "link", "set", self.dev, "up"),
            ("-n", self.name, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.destroy()
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr}")

    def destroy(self) -> None:
        for p in self.procs:
            stop_process(p)
        _ip("link", "del", self.host_dev)  # takes its peer with it
        _ip("netns", "del", self.name)

    def partition(self, cut: bool) -> None:
        done = _ip("link", "set", self.host_dev, "down" if cut else "up")
        if done.returncode != 0:
            raise RuntimeError(done.stderr)

    def _nft(self, rules: Iterable[str]) -> None:
        for rule in rules:
            done = subprocess.run(
                ["ip", "netns", "exec", self.name, "nft", *rule.split()],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"nft {rule}: {done.stderr}")

    def _chains(self) -> list[str]:
        return [
            f"add table inet {TABLE}",
            f"add chain inet {TABLE} out {{ type filter hook output priority 0; }}",
            f"add chain inet {TABLE} in {{ type filter hook input priority 0; }}",
        ]

    def cut_ports(self, ports: Iterable[int]) -> None:
        """Partition the namespace from the TCP ports `ports` of this side (a Redis, a
        cell), leaving the rest of the link up: nothing to them or from them crosses."""
        group = "{ " + ", ".join(str(p) for p in sorted(set(ports))) + " }"
        self._nft(
            [
                *self._chains(),
                f"add rule inet {TABLE} out oifname {self.dev} tcp dport {group} drop",
                f"add rule inet {TABLE} in iifname {self.dev} tcp sport {group} drop",
            ]
        )

    def cut_listeners(self, ports: Iterable[int]) -> None:
        """Partition this side from the namespace's TCP ports `ports` (its servers)."""
        group = "{ " + ", ".join(str(p) for p in sorted(set(ports))) + " }"
        self._nft(
            [
                *self._chains(),
                f"add rule inet {TABLE} in iifname {self.dev} tcp dport {group} drop",
                f"add rule inet {TABLE} out oifname {self.dev} tcp sport {group} drop",
            ]
        )

    def lose(self, loss_percent: int, listeners: Iterable[int] = ()) -> None:
        """Drop `loss_percent` of the packets crossing the pair each way; with
        `listeners`, only those to and from these TCP ports of the namespace's servers."""
        dev = self.dev
        some = f"numgen random mod 100 < {loss_percent} drop"
        match_in = match_out = ""
        if listeners:
            group = "{ " + ", ".join(str(p) for p in sorted(set(listeners))) + " }"
            match_in, match_out = f"tcp dport {group} ", f"tcp sport {group} "
        self._nft(
            [
                *self._chains(),
                f"add rule inet {TABLE} out oifname {dev} {match_out}{some}",
                f"add rule inet {TABLE} in iifname {dev} {match_in}{some}",
            ]
        )

    def heal(self) -> None:
        """Every rule of ours gone, the link up."""
        subprocess.run(
            ["ip", "netns", "exec", self.name, "nft", "delete", "table", "inet", TABLE],
            capture_output=True, timeout=10,
        )  # fmt: skip
        self.partition(False)

    def popen(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with log.open("ab") as out:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.name, *argv],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        self.procs.append(p)
        return p

    def redis(self, workdir: Path, *, here: bool = False) -> str:
        """A redis-server in the namespace on its address (`here`: on this side, on
        `host_ip`): its URL."""
        import redis

        port = free_port()
        host = self.host_ip if here else self.ip
        argv = [
            redis_server_binary(),
            "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
            "--dir", str(workdir),
        ]  # fmt: skip
        log = workdir / f"redis-{port}.log"
        if here:
            with log.open("ab") as out:
                self.procs.append(
                    subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
                )
        else:
            self.popen(argv, dict(os.environ), log)
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.RedisError):
                with redis.Redis(host=host, port=port) as r:
                    r.ping()
                    return f"redis://{host}:{port}/0"
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server in the namespace did not start")
            time.sleep(0.05)
