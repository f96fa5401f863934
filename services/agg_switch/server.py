"""gRPC servicer of agg_switch: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

from lightpath.v1 import agg_switch_pb2, agg_switch_pb2_grpc, common_pb2
from services.agg_switch.settings import AggSwitchSettings
from services.common.server import Runtime, ServiceDefinition

SERVICE_NAME = agg_switch_pb2.DESCRIPTOR.services_by_name["AggSwitch"].full_name


class AggSwitchServicer(agg_switch_pb2_grpc.AggSwitchServicer):
    def __init__(self, runtime: Runtime[AggSwitchSettings]):
        self._rt = runtime
        self._settings = runtime.settings

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        return self._rt.info(
            SERVICE_NAME, switch_id=self._settings.switch_id, tree=self._settings.tree_id
        )


async def build(runtime: Runtime[AggSwitchSettings]) -> list[ServiceDefinition]:
    servicer = AggSwitchServicer(runtime)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, agg_switch_pb2_grpc.add_AggSwitchServicer_to_server
        )
    ]
