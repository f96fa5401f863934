"""gRPC servicer of ocs_manager: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

from lightpath.v1 import common_pb2, ocs_manager_pb2, ocs_manager_pb2_grpc
from services.common.server import Runtime, ServiceDefinition
from services.ocs_manager.settings import OcsManagerSettings

SERVICE_NAME = ocs_manager_pb2.DESCRIPTOR.services_by_name["OcsManager"].full_name


class OcsManagerServicer(ocs_manager_pb2_grpc.OcsManagerServicer):
    def __init__(self, runtime: Runtime[OcsManagerSettings]):
        self._rt = runtime
        self._settings = runtime.settings

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        return self._rt.info(SERVICE_NAME, pod_id=self._settings.pod_id)


async def build(runtime: Runtime[OcsManagerSettings]) -> list[ServiceDefinition]:
    servicer = OcsManagerServicer(runtime)  # type: ignore[abstract]  # the OCS RPCs arrive with issue 3; until then they answer UNIMPLEMENTED
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, ocs_manager_pb2_grpc.add_OcsManagerServicer_to_server
        )
    ]
