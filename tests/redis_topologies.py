"""A real Redis Cluster (3 masters, one replica each) and a real Sentinel set-up (one
master, one or more replicas, three sentinels) on loopback, from the pip-shipped
redis-server and redis-cli (issue 16), each with the password the stack uses, and
a way to kill a master and wait until its replica has taken over — or (issue 32)
to pause one (SIGSTOP: a GC pause, a VM migration, a partition that the master's
clients outlive), wait until the sentinels promote a replica, resume it and wait
until they have turned it into a replica of the new master."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from lightpath.embedded_redis import free_port, redis_server_binary

PASSWORD = "topology-test-password"


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (so at most 55535)."""
    while True:
        port = free_port()
        if port <= 55535 and _free(port + 10000):
            return port


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _spawn(directory: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            redis_server_binary(),
            *args,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--logfile",
            str(directory / "redis.log"),
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{what} not reached in {timeout} s (last error: {last})")


def _server_args(password: str) -> list[str]:
    return [
        "--requirepass",
        password,
        "--masterauth",
        password,
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
    ]


def with_password(url: str) -> str:
    """`url` with PASSWORD in it (what a service is given)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://:{PASSWORD}@{rest}"


@dataclass
class Topology:
    url: str
    password: str
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=port, password=self.password, decode_responses=True
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()


class Cluster(Topology):
    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Live masters' ports and the slot ranges each serves."""
        for port, proc in self.procs.items():
            if proc.poll() is None:
                with self.client(port) as r:
                    out: dict[int, list[tuple[int, int]]] = {}
                    for (lo, hi), node in (
                        ((s[0], s[1]), s[2]) for s in r.execute_command("CLUSTER", "SLOTS")
                    ):
                        out.setdefault(int(node[1]), []).append((lo, hi))
                    return out
        raise RuntimeError("no node of the cluster is running")

    def master_of(self, key: str) -> int:
        slot = redis.cluster.key_slot(key.encode())
        for port, ranges in self.masters().items():
            if any(lo <= slot <= hi for lo, hi in ranges):
                return port
        raise RuntimeError(f"no master serves slot {slot}")

    def kill_master_of(self, key: str) -> tuple[int, int]:
        """SIGKILL the master serving `key`; wait until a replica serves its slot and
        the cluster is ok again. (old port, new port)."""
        old = self.master_of(key)
        self.procs[old].kill()
        self.procs[old].wait()

        def promoted() -> bool:
            survivor = next(p for p, proc in self.procs.items() if proc.poll() is None)
            with self.client(survivor) as r:
                if "cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                    return False
            return self.master_of(key) != old

        _wait(promoted, f"a replica taking over from the master on port {old}")
        return old, self.master_of(key)


class SentinelSet(Topology):
    service = "lightpath"
    sentinels: list[int]

    def master(self) -> int:
        with redis.Redis(host="127.0.0.1", port=self.sentinels[0], decode_responses=True) as s:
            _host, port = s.sentinel_get_master_addr_by_name(self.service)
            return int(port)

    def kill_master(self) -> tuple[int, int]:
        old = self.master()
        self.procs[old].kill()
        self.procs[old].wait()

        def switched() -> bool:
            new = self.master()
            if new == old:
                return False
            with self.client(new) as r:
                return r.info("replication")["role"] == "master"

        _wait(switched, f"the sentinels choosing a new master after {old}")
        return old, self.master()

    def replication(self, port: int) -> dict:
        with self.client(port) as r:
            return r.info("replication")

    def pause_master(self) -> tuple[int, int]:
        """SIGSTOP the master and wait until the sentinels have promoted a replica and
        pointed every other replica at it; the old master stays stopped (its clients'
        connections hang, as they would across a partition). (old port, new port)."""
        old = self.master()
        os.kill(self.procs[old].pid, signal.SIGSTOP)
        others = [p for p in self.procs if p != old and p not in self.sentinels]

        def switched() -> bool:
            new = self.master()
            if new == old or self.replication(new)["role"] != "master":
                return False
            return all(
                int(self.replication(p).get("master_port", 0)) == new for p in others if p != new
            )

        _wait(switched, f"the sentinels promoting a replica of the paused master {old}")
        return old, self.master()

    def resume(self, old: int) -> None:
        """SIGCONT a paused master (it answers as a master until the sentinels demote it,
        ~8 s after they see it again: Sentinel waits that long for newer configurations)."""
        os.kill(self.procs[old].pid, signal.SIGCONT)

    def wait_rejoined(self, old: int) -> None:
        """Until a resumed master replicates from the new master and every replica is
        connected to it."""
        replicas = len(self.procs) - len(self.sentinels) - 1

        def rejoined() -> bool:
            mine = self.replication(old)
            if mine["role"] != "slave" or mine.get("master_link_status") != "up":
                return False
            new = self.master()
            return (
                int(mine["master_port"]) == new
                and self.replication(new)["connected_slaves"] == replicas
            )

        _wait(rejoined, f"the old master {old} replicating from the new one", timeout=60)


@contextlib.contextmanager
def redis_cluster(directory: Path, masters: int = 3, replicas: int = 1) -> Iterator[Cluster]:
    ports = [cluster_port() for _ in range(masters * (1 + replicas))]
    cluster = Cluster(
        "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports[:masters]), PASSWORD
    )
    try:
        for port in ports:
            cluster.procs[port] = _spawn(
                directory / str(port),
                port,
                *_server_args(PASSWORD),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
            )
        for port in ports:
            _wait(lambda p=port: cluster.client(p).ping(), f"redis-server on {port}")
        cli = Path(redis_server_binary()).with_name("redis-cli")
        subprocess.run(
            [
                str(cli),
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            env={"REDISCLI_AUTH": PASSWORD},
            check=True,
            capture_output=True,
            timeout=60,
        )

        def ready() -> bool:
            for port in ports:
                with cluster.client(port) as r:
                    if "cluster_state:ok" not in r.execute_command("CLUSTER", "INFO"):
                        return False
            return len(cluster.masters()) == masters

        _wait(ready, "the cluster's state ok on every node")
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def redis_sentinel(directory: Path, replicas: int = 1) -> Iterator[SentinelSet]:
    master = free_port()
    replica_ports = [free_port() for _ in range(replicas)]
    sentinels = [free_port() for _ in range(3)]
    topo = SentinelSet(
        "redis+sentinel://"
        + ",".join(f"127.0.0.1:{p}" for p in sentinels)
        + f"/{SentinelSet.service}/0",
        PASSWORD,
    )
    topo.sentinels = sentinels
    try:
        topo.procs[master] = _spawn(directory / "master", master, *_server_args(PASSWORD))
        for i, replica in enumerate(replica_ports):
            topo.procs[replica] = _spawn(
                directory / ("replica" if i == 0 else f"replica-{i + 1}"),
                replica,
                *_server_args(PASSWORD),
                "--replicaof",
                "127.0.0.1",
                str(master),
            )

        def replicating() -> bool:
            with topo.client(master) as r:
                return r.info("replication")["connected_slaves"] == replicas

        _wait(replicating, "the replica replicating")
        for port in sentinels:
            d = directory / f"sentinel-{port}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {topo.service} 127.0.0.1 {master} 2\n"
                f"sentinel auth-pass {topo.service} {PASSWORD}\n"
                f"sentinel down-after-milliseconds {topo.service} 1000\n"
                f"sentinel failover-timeout {topo.service} 5000\n"
            )
            topo.procs[port] = subprocess.Popen(
                [
                    redis_server_binary(),
                    str(conf),
                    "--sentinel",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(d),
                    "--logfile",
                    str(d / "sentinel.log"),
                    "--protected-mode",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

        def watching() -> bool:
            for port in sentinels:
                with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as s:
                    fields = s.sentinel_master(topo.service)
                    if (
                        int(fields["num-other-sentinels"]) < 2
                        or int(fields["num-slaves"]) < replicas
                    ):
                        return False
            return True

        _wait(watching, "three sentinels watching the master and its replica")
        yield topo
    finally:
        topo.stop()
