"""gRPC servicer of core_broker: protobuf <-> domain, errors -> status (via the runtime)."""

from __future__ import annotations

from lightpath.v1 import common_pb2, core_broker_pb2, core_broker_pb2_grpc
from services.common.server import Runtime, ServiceDefinition
from services.core_broker.settings import CoreBrokerSettings

SERVICE_NAME = core_broker_pb2.DESCRIPTOR.services_by_name["CoreBroker"].full_name


class CoreBrokerServicer(core_broker_pb2_grpc.CoreBrokerServicer):
    def __init__(self, runtime: Runtime[CoreBrokerSettings]):
        self._rt = runtime
        self._settings = runtime.settings

    async def GetInfo(self, request: common_pb2.GetInfoRequest, context) -> common_pb2.ServiceInfo:
        return self._rt.info(SERVICE_NAME)


async def build(runtime: Runtime[CoreBrokerSettings]) -> list[ServiceDefinition]:
    servicer = CoreBrokerServicer(runtime)
    return [
        ServiceDefinition(
            SERVICE_NAME, servicer, core_broker_pb2_grpc.add_CoreBrokerServicer_to_server
        )
    ]
