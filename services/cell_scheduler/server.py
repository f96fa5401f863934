"""gRPC servicer of cell_scheduler: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc, common_pb2
from services.cell_scheduler.settings import CellSchedulerSettings
from services.common.server import Runtime, ServiceDefinition

SERVICE_NAME = cell_scheduler_pb2.DESCRIPTOR.services_by_name["CellScheduler"].full_name


class CellSchedulerServicer(cell_scheduler_pb2_grpc.CellSchedulerServicer):
    def __init__(self, runtime: Runtime[CellSchedulerSettings]):
        self._rt = runtime
        self._settings = runtime.settings

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        return self._rt.info(SERVICE_NAME)


async def build(runtime: Runtime[CellSchedulerSettings]) -> list[ServiceDefinition]:
    servicer = CellSchedulerServicer(runtime)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, cell_scheduler_pb2_grpc.add_CellSchedulerServicer_to_server
        )
    ]
