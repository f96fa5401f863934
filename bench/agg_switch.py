"""Benchmark of agg_switch (seed 003, AG-3 … AG-14): one JSON line.

    python3 dev.py bench agg_switch [--reps 5] [--mib 16] [--chunk-bytes 4194304]

In one run, on this machine:

* agg_bytes_per_s: 8 compute nodes (8 processes) × 16 MiB float32 summed
  through a root and two sub-switches (3 agg_switch processes, real gRPC),
  every node receiving the result: 8 × 16 MiB / wall time, median of --reps.
  The default transport: everything runs on this host, so chunks move through
  shared memory (the nodes' vectors come from `ComputeNode.empty`).
  agg_bytes_per_s_grpc: the same through a second tree whose switches run
  with LIGHTPATH_AGG_TRANSPORT=grpc (and nodes with transport="grpc"): the
  gRPC bytes path. gloo_bytes_per_s: torch.distributed all_reduce (gloo) of
  the same data across 8 processes, same measure. The three alternate rep by
  rep so they see the same machine load (gloo null, "baseline unavailable" on
  stderr, without torch: `pip install -e .[gloo]`). ratio_vs_gloo = agg /
  gloo. Every rep's figures go to stderr (the spread).
* hold_ms_timeout / hold_ms_wait_all: one node 500 ms late, thresholds 50 ms
  (sub-switches): the longest any switch held a slot for one chunk, with
  timeouts and with the same service told to wait for all.
* tenant_aggs_per_s_*: 4 tenants share one switch with 4 slots (each command
  is 4 chunks); tenant 0 always has a node 500 ms late; the other tenants'
  completed aggregations per second over a window; tenant_ratio = timeout / wait.
* exact_cost_ratio: wall time of the EXACT (fixed-point) path / the PRESET
  float path, the first measurement's set-up (also alternating).

Everything runs as users do: mTLS with a certificate per process from a CA
in a temporary directory, each switch as `service:agg_switch/<id>`, each
compute node as `node:<id>`, the bench's own management calls as the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_ca, emit, operator_credentials, private_redis, service_tls_env

from lightpath.embedded_redis import free_port

ROOT = Path(__file__).resolve().parent.parent
N_NODES = 8


# -- identities ------------------------------------------------------------------


class Pki:
    """The bench's CA (in a temporary directory) and the identities it issues."""

    def __init__(self, directory: str):
        self.ca = bench_ca(directory)
        self.operator = operator_credentials(self.ca)
        self._nodes: dict[str, Any] = {}

    def switch_env(self, switch_id: str) -> dict[str, str]:
        from lightpath.security.identity import service_principal

        return service_tls_env(self.ca, service_principal("agg_switch", switch_id))

    def node_files(self, node_id: str) -> tuple[str, str, str]:
        """(CA, certificate, key) of compute node `node_id`: for a node process to load."""
        from lightpath.security.identity import NODE, Principal

        files = self.ca.issue(Principal(NODE, node_id))
        return str(files.ca), str(files.cert), str(files.key)

    def node(self, node_id: str):
        """Compute node `node_id`'s own credentials (what `aggregate_all` takes per node)."""
        creds = self._nodes.get(node_id)
        if creds is None:
            from lightpath.security.credentials import Credentials

            creds = self._nodes[node_id] = Credentials.from_files(*self.node_files(node_id))
        return creds


# -- processes -------------------------------------------------------------------


def spawn_switch(pki: Pki, redis_url: str, switch_id: str, tree: str, port: int, **env: str):
    full = {
        **os.environ,
        **pki.switch_env(switch_id),
        "LIGHTPATH_REDIS_URL": redis_url,
        "LIGHTPATH_LISTEN": f"127.0.0.1:{port}",
        "LIGHTPATH_SWITCH_ID": switch_id,
        "LIGHTPATH_AGG_TREE": tree,
        "LIGHTPATH_LOG_LEVEL": "warning",
        "LIGHTPATH_INSTANCE_ID": f"bench-{switch_id}",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "lightpath_services.agg_switch"],
        env=full,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def switches(pki: Pki, redis_url: str, tree: str, ids: list[str], **env: str):
    from lightpath.stack import health_status

    ports = {s: free_port() for s in ids}
    procs = [spawn_switch(pki, redis_url, s, tree, p, **env) for s, p in ports.items()]
    try:
        deadline = time.monotonic() + 60
        for p in ports.values():
            while (
                health_status(f"127.0.0.1:{p}", timeout=0.5, credentials=pki.operator) != "SERVING"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("switches did not start")
                time.sleep(0.05)
        yield {s: f"127.0.0.1:{p}" for s, p in ports.items()}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def define(pki: Pki, address: str, tree: str, nodes) -> None:
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    async with channel(address, credentials=pki.operator) as ch:
        stub = agg_switch_pb2_grpc.AggSwitchStub(ch)
        for _ in range(100):  # the switches register their addresses as they start
            topo = await stub.DefineTopology(
                pb.DefineTopologyRequest(topology=pb.AggTopology(tree_id=tree, nodes=nodes))
            )
            if len(topo.endpoints) >= len([n for n in nodes if n.kind == pb.AGG_NODE_KIND_SWITCH]):
                return
            await asyncio.sleep(0.1)


async def start(
    pki: Pki, address: str, tree: str, command_id: str, participants, length: int, **kw
):
    from google.protobuf import duration_pb2

    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    async with channel(address, credentials=pki.operator) as ch:
        return await agg_switch_pb2_grpc.AggSwitchStub(ch).StartCommand(
            pb.StartCommandRequest(
                tree_id=tree,
                command_id=command_id,
                participants=list(participants),
                dtype=kw.pop("dtype", pb.AGG_DTYPE_FLOAT32),
                op=pb.AGG_OP_SUM,
                length=length,
                deadline=duration_pb2.Duration(seconds=60),
                **kw,
            )
        )


async def command(pki: Pki, address: str, tree: str, command_id: str):
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    async with channel(address, credentials=pki.operator) as ch:
        stub = agg_switch_pb2_grpc.AggSwitchStub(ch)
        for _ in range(200):
            cmd = await stub.GetCommand(pb.GetCommandRequest(tree_id=tree, command_id=command_id))
            if cmd.state != pb.AGG_COMMAND_STATE_RUNNING and len(cmd.slot_holds) >= len(
                cmd.bitmaps
            ):
                return cmd
            await asyncio.sleep(0.02)
        return cmd


# -- 1. throughput: 8 node processes through root + 2 sub-switches -------------------


def node_worker(
    node_id: str,
    address: str,
    tree: str,
    elems: int,
    value: float,
    transport: str,
    files: tuple[str, str, str],
    conn,
) -> None:
    """One compute node process: aggregate each command id it is sent, report the time.
    `files`: its own (CA, certificate, key)."""
    import numpy as np

    from lightpath.aggregation.node import ComputeNode
    from lightpath.security.credentials import Credentials

    out = np.empty(elems, np.float32)
    creds = Credentials.from_files(*files, source=f"bench node {node_id}")

    async def serve() -> None:
        async with ComputeNode(
            node_id, address, tree_id=tree, transport=transport, credentials=creds
        ) as node:
            vector = node.empty(elems, np.float32)  # shared memory when the switch is local
            vector[:] = value
            loop = asyncio.get_running_loop()
            conn.send("ready")
            while True:
                command_id = await loop.run_in_executor(None, conn.recv)
                if command_id is None:
                    return
                t0 = time.perf_counter()
                res = await node.aggregate(command_id, vector, out=out)
                conn.send((time.perf_counter() - t0, float(res.values[0]), float(res.values[-1])))

    asyncio.run(serve())


class NodeProcesses:
    """8 compute-node processes that aggregate whatever command id they are sent."""

    def __init__(
        self, pki: Pki, address: str, tree: str, names: list[str], elems: int, transport: str
    ):
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for i, n in enumerate(names):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=node_worker,
                args=(n, address, tree, elems, i + 1.0, transport, pki.node_files(n), child),
            )
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        for c in self.pipes:
            assert c.recv() == "ready"

    def run(self, command_id: str) -> float:
        t0 = time.perf_counter()
        for c in self.pipes:
            c.send(command_id)
        outs = [c.recv() for c in self.pipes]
        dt = time.perf_counter() - t0
        want = float(sum(range(1, N_NODES + 1)))
        assert all(o[1] == want and o[2] == want for o in outs), outs
        return dt

    def close(self) -> None:
        for c in self.pipes:
            c.send(None)
        for p in self.procs:
            p.join(30)


def gloo_worker(rank: int, port: int, elems: int, conn) -> None:
    """One gloo rank: an all_reduce of the same data whenever the parent says go."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=N_NODES)
    conn.send("ready")
    while conn.recv():
        t = torch.full((elems,), float(rank + 1))
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        dist.barrier()
        conn.send((time.perf_counter() - t0, float(t[0])))
    dist.destroy_process_group()


class GlooProcesses:
    def __init__(self, elems: int):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.pipes, self.procs = [], []
        for r in range(N_NODES):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=gloo_worker, args=(r, port, elems, child))
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)
        for c in self.pipes:
            assert c.recv() == "ready"

    def run(self) -> float:
        for c in self.pipes:
            c.send(True)
        outs = [c.recv() for c in self.pipes]
        assert all(o[1] == float(sum(range(1, N_NODES + 1))) for o in outs)
        return outs[0][0]

    def close(self) -> None:
        for c in self.pipes:
            c.send(False)
        for p in self.procs:
            p.join(60)


def gloo_available() -> bool:
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("gloo backend missing")
    except ImportError as exc:
        print(f"baseline unavailable: torch.distributed gloo ({exc})", file=sys.stderr)
        return False
    return True


def stack_nodes(names: list[str], root_ms: int, sub_ms: int):
    """root over sub-1 (the first half of `names`) and sub-2 (the rest)."""
    from lightpath.v1 import agg_switch_pb2 as pb

    half = len(names) // 2
    return [
        pb.AggNode(id="root", kind=pb.AGG_NODE_KIND_SWITCH, threshold_ms=root_ms),
        pb.AggNode(id="sub-1", kind=pb.AGG_NODE_KIND_SWITCH, parent="root", threshold_ms=sub_ms),
        pb.AggNode(id="sub-2", kind=pb.AGG_NODE_KIND_SWITCH, parent="root", threshold_ms=sub_ms),
    ] + [
        pb.AggNode(id=n, kind=pb.AGG_NODE_KIND_COMPUTE, parent="sub-1" if i < half else "sub-2")
        for i, n in enumerate(names)
    ]


class BenchTree:
    """Root + two sub-switches (processes) and 8 node processes, one transport."""

    def __init__(
        self, pki: Pki, redis_url: str, tree: str, elems: int, chunk_bytes: int, transport: str
    ):
        self.pki = pki
        self.tree, self.elems, self.chunk_bytes = tree, elems, chunk_bytes
        self.names = [f"n{i}" for i in range(N_NODES)]
        nodes_pb = stack_nodes(self.names, root_ms=5000, sub_ms=5000)
        self._switches = switches(
            pki, redis_url, tree, ["root", "sub-1", "sub-2"], LIGHTPATH_AGG_TRANSPORT=transport
        )
        self.addr = self._switches.__enter__()
        try:
            asyncio.run(define(pki, self.addr["root"], tree, nodes_pb))
            self.nodes = NodeProcesses(pki, self.addr["root"], tree, self.names, elems, transport)
        except BaseException:
            self._switches.__exit__(None, None, None)
            raise

    def run(self, command_id: str, **kw) -> float:
        asyncio.run(
            start(
                self.pki,
                self.addr["root"],
                self.tree,
                command_id,
                self.names,
                self.elems,
                chunk_bytes=self.chunk_bytes,
                **kw,
            )
        )
        return self.nodes.run(command_id)

    def close(self) -> None:
        try:
            self.nodes.close()
        finally:
            self._switches.__exit__(None, None, None)


def side_by_side(
    pki: Pki, redis_url: str, mib: int, reps: int, chunk_bytes: int
) -> tuple[float, float, float | None, float]:
    """The tree (default transport and forced gRPC) and gloo, alternating rep by rep
    so all see the same machine load.

    Returns (tree bytes/s, gRPC-path bytes/s, gloo bytes/s or None, EXACT time / PRESET time)."""
    from lightpath.v1 import agg_switch_pb2 as pb

    elems = mib * (1 << 20) // 4
    default = BenchTree(pki, redis_url, "bench", elems, chunk_bytes, "auto")
    grpc_path = base = None
    try:
        grpc_path = BenchTree(pki, redis_url, "bench-grpc", elems, chunk_bytes, "grpc")
        base = GlooProcesses(elems) if gloo_available() else None
        default.run("warm-up")
        default.run("warm-up-exact", order_policy=pb.ORDER_POLICY_EXACT)  # its pools too
        grpc_path.run("warm-up")
        if base is not None:
            base.run()
        preset, via_grpc, exact, gloo_t = [], [], [], []
        for r in range(reps):
            preset.append(default.run(f"preset-{r}"))
            via_grpc.append(grpc_path.run(f"grpc-{r}"))
            if base is not None:
                gloo_t.append(base.run())
            exact.append(default.run(f"exact-{r}", order_policy=pb.ORDER_POLICY_EXACT))
    finally:
        for part in (base, grpc_path, default):
            if part is not None:
                part.close()
    total = N_NODES * mib * (1 << 20)
    print(
        "per rep, MB/s — shm:",
        [round(total / t / 1e6) for t in preset],
        "grpc:",
        [round(total / t / 1e6) for t in via_grpc],
        "gloo:",
        [round(total / t / 1e6) for t in gloo_t],
        "exact/preset:",
        [round(e / p, 2) for e, p in zip(exact, preset, strict=True)],
        file=sys.stderr,
    )
    t = statistics.median(preset)
    return (
        total / t,
        total / statistics.median(via_grpc),
        total / statistics.median(gloo_t) if gloo_t else None,
        statistics.median(exact) / t,
    )


# -- 2. slot hold with one straggler -----------------------------------------------------


async def hold_times(
    pki: Pki, addr: dict[str, str], tree: str, names: list[str]
) -> tuple[float, float]:
    """The straggler sends 500 ms after the first data reached its switch."""
    import numpy as np

    from lightpath.aggregation.node import ComputeNode, aggregate_all
    from lightpath.client import channel
    from lightpath.v1 import agg_switch_pb2 as pb
    from lightpath.v1 import agg_switch_pb2_grpc

    elems = 1 << 18
    inputs = {n: np.full(elems, 1.0, np.float32) for n in names}
    straggler, on_time = names[0], {n: inputs[n] for n in names[1:]}
    out = []
    async with channel(addr["sub-1"], credentials=pki.operator) as ch:
        sub1 = agg_switch_pb2_grpc.AggSwitchStub(ch)
        for wait_for_all in (False, True):
            cid = f"hold-{'wait' if wait_for_all else 'timeout'}"
            await start(
                pki,
                addr["root"],
                tree,
                cid,
                names,
                elems,
                chunk_bytes=1 << 18,
                wait_for_all=wait_for_all,
            )
            others = asyncio.ensure_future(
                aggregate_all(addr["root"], cid, on_time, credentials=pki.node)
            )
            while True:  # the first arrival at the straggler's switch
                state = await sub1.GetSwitchState(pb.GetSwitchStateRequest())
                if state.slots_in_use or state.bypass_entries:
                    break
                await asyncio.sleep(0.002)
            await asyncio.sleep(0.5)
            async with ComputeNode(
                straggler, addr["root"], tree_id=tree, credentials=pki.node(straggler)
            ) as node:
                await node.aggregate(cid, inputs[straggler])
            await others
            cmd = await command(pki, addr["root"], tree, cid)
            out.append(max(h.max_ms for h in cmd.slot_holds))
    return out[0], out[1]


def holds(pki: Pki, redis_url: str) -> tuple[float, float]:
    tree = "hold"
    names = [f"h{i}" for i in range(N_NODES)]
    nodes_pb = stack_nodes(names, root_ms=100, sub_ms=50)
    with switches(pki, redis_url, tree, ["root", "sub-1", "sub-2"]) as addr:

        async def go():
            await define(pki, addr["root"], tree, nodes_pb)
            return await hold_times(pki, addr, tree, names)

        return asyncio.run(go())


# -- 3. tenants sharing a switch with too few slots --------------------------------------


async def tenant_rate(
    pki: Pki, address: str, tree: str, wait_for_all: bool, window_s: float
) -> float:
    import numpy as np

    from lightpath.aggregation.node import aggregate_all

    elems, chunk = 1 << 16, 1 << 14  # 4 chunks of 64 KiB per command, 4 slots on the switch
    done = [0] * 4
    stop = time.monotonic() + window_s

    async def tenant(t: int) -> None:
        i = 0
        names = [f"t{t}a", f"t{t}b"]
        inputs = {n: np.full(elems, 1.0, np.float32) for n in names}
        while time.monotonic() < stop:
            cid = f"t{t}-{'w' if wait_for_all else 't'}-{i}"
            i += 1
            await start(
                pki,
                address,
                tree,
                cid,
                names,
                elems,
                chunk_bytes=chunk * 4,
                tenant=f"tenant-{t}",
                wait_for_all=wait_for_all,
            )
            await aggregate_all(
                address,
                cid,
                inputs,
                delays={names[0]: 0.5} if t == 0 else None,
                credentials=pki.node,
            )
            if time.monotonic() <= stop:
                done[t] += 1

    await asyncio.gather(*(tenant(t) for t in range(4)))
    return sum(done[1:]) / window_s


def tenants(pki: Pki, redis_url: str, window_s: float) -> tuple[float, float]:
    from lightpath.v1 import agg_switch_pb2 as pb

    tree = "tenants"
    nodes_pb = [pb.AggNode(id="shared", kind=pb.AGG_NODE_KIND_SWITCH, threshold_ms=50)] + [
        pb.AggNode(id=f"t{t}{x}", kind=pb.AGG_NODE_KIND_COMPUTE, parent="shared")
        for t in range(4)
        for x in "ab"
    ]
    with switches(pki, redis_url, tree, ["shared"], LIGHTPATH_AGG_SLOTS="4") as addr:

        async def go():
            await define(pki, addr["shared"], tree, nodes_pb)
            timeout = await tenant_rate(pki, addr["shared"], tree, False, window_s)
            wait = await tenant_rate(pki, addr["shared"], tree, True, window_s)
            return timeout, wait

        return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mib", type=int, default=16, help="MiB of float32 per node")
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20)
    parser.add_argument("--window-s", type=float, default=3.0)
    args = parser.parse_args()
    with (
        private_redis() as redis_url,
        tempfile.TemporaryDirectory(prefix="lightpath-bench-pki-") as pki_dir,
    ):
        pki = Pki(pki_dir)
        agg, agg_grpc, base, exact_ratio = side_by_side(
            pki, redis_url, args.mib, args.reps, args.chunk_bytes
        )
        hold_t, hold_w = holds(pki, redis_url)
        rate_t, rate_w = tenants(pki, redis_url, args.window_s)
    emit(
        {
            "agg_bytes_per_s": agg,
            "agg_bytes_per_s_grpc": agg_grpc,
            "gloo_bytes_per_s": base,
            "ratio_vs_gloo": None if base is None else agg / base,
            "hold_ms_timeout": hold_t,
            "hold_ms_wait_all": hold_w,
            "tenant_aggs_per_s_timeout": rate_t,
            "tenant_aggs_per_s_wait_all": rate_w,
            "tenant_ratio": rate_t / rate_w if rate_w else None,
            "exact_cost_ratio": exact_ratio,
        }
    )


if __name__ == "__main__":
    main()
