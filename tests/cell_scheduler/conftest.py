"""A real cell: cell_scheduler replica(s) and superpods (ocs_manager + workload_scheduler
each, registering with the cell), all in-process over gRPC on one real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from lightpath.client import channel
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import (
    cell_scheduler_pb2_grpc,
    common_pb2,
    ocs_manager_pb2,
    ocs_manager_pb2_grpc,
    workload_scheduler_pb2_grpc,
)
from lightpath.v1 import workload_scheduler_pb2 as ws
from tests.helpers import serve
from tests.workload_scheduler.conftest import rpc_error

__all__ = ["Cell", "cell_stack", "rpc_error"]

C = common_pb2
HEARTBEAT_S = "0.2"
POD_TIMEOUT_S = "1.5"


@dataclass
class Pod:
    pod_id: str
    ocs: ocs_manager_pb2_grpc.OcsManagerStub
    ws: workload_scheduler_pb2_grpc.WorkloadSchedulerStub
    ws_env: dict[str, str]
    ws_address: str = ""
    _ws_cm: Any = None

    async def wiring(self, job_id: str) -> ocs_manager_pb2.SliceWiring | None:
        try:
            return await self.ocs.GetSliceWiring(
                ocs_manager_pb2.GetSliceWiringRequest(job_id=job_id)
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def job(self, job_id: str) -> ws.Job | None:
        try:
            return await self.ws.GetJob(ws.GetJobRequest(job_id=job_id))
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def view(self) -> ws.PodView:
        return await self.ws.GetPod(ws.GetPodRequest())


@dataclass
class Cell:
    cells: list[cell_scheduler_pb2_grpc.CellSchedulerStub]
    pods: dict[str, Pod]
    redis_url: str
    cell_addresses: list[str] = field(default_factory=list)
    ocs_addresses: dict[str, str] = field(default_factory=dict)  # "ocs-<pod>" -> address
    stack: contextlib.AsyncExitStack | None = None
    tracer_providers: dict[str, Any] = field(default_factory=dict)

    @property
    def cell(self) -> cell_scheduler_pb2_grpc.CellSchedulerStub:
        return self.cells[0]

    async def submit(
        self, job_id: str, chips=(4, 4, 4), *, replica: int = 0, tenant: str = "", **spec
    ) -> cs.SubmitJobResponse:
        demand = spec.pop("demand", None)
        on = spec.pop("only_pod", "")  # the job waits for that pod rather than go elsewhere
        prefer = spec.pop("prefer_pod", "")  # ... or goes first there when it can
        if chips is not None:
            spec.setdefault("shape", C.Shape(dims=list(chips)))
        return await self.cells[replica].SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id=job_id, **spec),
                tenant=tenant,
                demand=demand,
                preferred_pod=on or prefer,
                require_preferred_pod=bool(on),
            )
        )

    async def job(self, job_id: str, replica: int = 0) -> cs.CellJob:
        return await self.cells[replica].GetJob(cs.GetCellJobRequest(job_id=job_id))

    async def pods_view(self) -> dict[str, cs.Pod]:
        resp = await self.cell.ListPods(cs.ListPodsRequest())
        return {p.registration.pod_id: p for p in resp.pods}

    async def wait_for(self, predicate, timeout: float = 15.0, what: str = "condition"):
        """Poll an async predicate until it returns something truthy."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = None
        while loop.time() < deadline:
            last = await predicate()
            if last:
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: last {last!r}")

    async def wait_ready(self, *pod_ids: str) -> None:
        wanted = set(pod_ids or self.pods)

        async def ready():
            pods = await self.pods_view()
            return all(
                p in pods and pods[p].status == cs.POD_STATUS_READY and pods[p].capacity.types
                for p in wanted
            )

        await self.wait_for(ready, what=f"pods {sorted(wanted)} registered and reporting")

    async def wait_free(self, pod_id: str, node_type: str, free: int) -> None:
        """Until the cell's registry shows `free` healthy free blocks on the pod."""

        async def check():
            pods = await self.pods_view()
            t = [t for t in pods[pod_id].capacity.types if t.node_type == node_type]
            return t and t[0].free == free

        await self.wait_for(check, what=f"{pod_id} reporting {free} free {node_type}")

    async def wait_capacity(self, pod_id: str, check, what: str) -> cs.Pod:
        """Until the pod's reported capacity satisfies check(PodCapacity)."""

        async def ok():
            pod = (await self.pods_view())[pod_id]
            return pod if check(pod.capacity) else None

        return await self.wait_for(ok, what=what)

    async def wait_state(self, job_id: str, state: int, timeout: float = 15.0) -> cs.CellJob:
        async def check():
            job = await self.job(job_id)
            return job if job.state == state else None

        return await self.wait_for(check, timeout, what=f"{job_id} {C.JobState.Name(state)}")

    async def stop_pod(self, pod_id: str) -> None:
        """Stop a pod's workload scheduler (the ocs_manager stays)."""
        pod = self.pods[pod_id]
        await pod._ws_cm.__aexit__(None, None, None)
        pod._ws_cm = None

    async def start_pod(self, pod_id: str) -> None:
        pod = self.pods[pod_id]
        cm = serve(
            "workload_scheduler",
            self.redis_url,
            pod.ws_env,
            tracer_provider=self.tracer_providers.get("workload_scheduler"),
        )
        svc = await cm.__aenter__()
        pod._ws_cm = cm
        pod.ws_address = svc.address
        assert self.stack is not None
        ch = await self.stack.enter_async_context(channel(svc.address, max_attempts=1))
        pod.ws = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)


def pod_env(pod_id: str, blocks: int, k: int = 1) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": pod_id,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
        "LIGHTPATH_FABRIC_BLOCKS": str(blocks),
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
        "LIGHTPATH_FABRIC_OCS_RADIX": str(max(136, 3 * blocks)),
    }


# A SWITCHED pod (seed 002) as `lightpath up` has pod-3: 2x4 groups of 3x3 processors.
SWITCHED_FABRIC = "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64"


def switched_env(pod_id: str) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": pod_id,
        "LIGHTPATH_FABRIC_KIND": "SWITCHED",
        "LIGHTPATH_SWITCHED_FABRIC": SWITCHED_FABRIC,
    }


@contextlib.asynccontextmanager
async def cell_stack(
    redis_url: str,
    *,
    pods: tuple[tuple[str, int, str], ...] = (("pod-a", 8, "tpu"), ("pod-b", 8, "tpu")),
    replicas: int = 1,
    cell_env: dict[str, str] | None = None,
    tracer_providers: dict[str, Any] | None = None,
    wait: bool = True,
    switched: tuple[str, ...] = (),
    switched_small: int = 2,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Cell]:
    """`switched`: ids of `pods` served as SWITCHED pods (their block count is the
    fabric's, SWITCHED_FABRIC, and their node type must be one name), with
    `switched_small` groups reserved for small jobs. `env`: settings of every service."""
    every = env or {}
    providers = tracer_providers or {}
    async with contextlib.AsyncExitStack() as stack:
        cells, addresses = [], []
        for i in range(replicas):
            svc = await stack.enter_async_context(
                serve(
                    "cell_scheduler",
                    redis_url,
                    {
                        "LIGHTPATH_CELL_POD_TIMEOUT_S": POD_TIMEOUT_S,
                        "LIGHTPATH_CELL_RECONCILE_S": "0.1",
                        "LIGHTPATH_INSTANCE_ID": f"cell-{i}",
                        **every,
                        **(cell_env or {}),
                    },
                    tracer_provider=providers.get("cell_scheduler"),
                )
            )
            ch = await stack.enter_async_context(channel(svc.address, max_attempts=1))
            cells.append(cell_scheduler_pb2_grpc.CellSchedulerStub(ch))
            addresses.append(svc.address)
        cell = Cell(
            cells, {}, redis_url, cell_addresses=addresses, stack=stack, tracer_providers=providers
        )
        for pod_id, blocks, types in pods:
            ocs_svc = await stack.enter_async_context(
                serve(
                    "ocs_manager",
                    redis_url,
                    {
                        **(switched_env(pod_id) if pod_id in switched else pod_env(pod_id, blocks)),
                        **every,
                    },
                    tracer_provider=providers.get("ocs_manager"),
                )
            )
            ocs_ch = await stack.enter_async_context(channel(ocs_svc.address, max_attempts=1))
            cell.ocs_addresses[f"ocs-{pod_id}"] = ocs_svc.address
            env = {
                "LIGHTPATH_POD_ID": pod_id,
                "LIGHTPATH_OCS_ADDR": ocs_svc.address,
                "LIGHTPATH_BLOCK_TYPES": types,
                "LIGHTPATH_CELL_ADDR": addresses[0],
                "LIGHTPATH_CELL_HEARTBEAT_S": HEARTBEAT_S,
                "LIGHTPATH_WS_RECONCILE_S": "0.2",
                "LIGHTPATH_INSTANCE_ID": f"ws-{pod_id}",
                **every,
            }
            if pod_id in switched:
                env["LIGHTPATH_SWITCHED_SMALL_GROUPS"] = str(switched_small)
            cell.pods[pod_id] = Pod(
                pod_id,
                ocs_manager_pb2_grpc.OcsManagerStub(ocs_ch),
                None,
                env,  # type: ignore[arg-type]
            )
            await cell.start_pod(pod_id)
        try:
            if wait:
                await cell.wait_ready()
            yield cell
        finally:
            for pod in cell.pods.values():
                if pod._ws_cm is not None:
                    await pod._ws_cm.__aexit__(None, None, None)


@pytest.fixture
async def cell2(redis_url) -> AsyncIterator[Cell]:
    async with cell_stack(redis_url) as c:
        yield c
