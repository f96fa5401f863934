"""gRPC servicer of workload_scheduler: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc
from services.common.server import Runtime, ServiceDefinition
from services.workload_scheduler.settings import WorkloadSchedulerSettings

SERVICE_NAME = workload_scheduler_pb2.DESCRIPTOR.services_by_name["WorkloadScheduler"].full_name


class WorkloadSchedulerServicer(workload_scheduler_pb2_grpc.WorkloadSchedulerServicer):
    def __init__(self, runtime: Runtime[WorkloadSchedulerSettings]):
        self._rt = runtime
        self._settings = runtime.settings

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        return self._rt.info(
            SERVICE_NAME, pod_id=self._settings.pod_id, ocs_manager=self._settings.ocs_addr
        )


async def build(runtime: Runtime[WorkloadSchedulerSettings]) -> list[ServiceDefinition]:
    servicer = WorkloadSchedulerServicer(runtime)
    return [
        ServiceDefinition(
            SERVICE_NAME,
            servicer,
            workload_scheduler_pb2_grpc.add_WorkloadSchedulerServicer_to_server,
        )
    ]
