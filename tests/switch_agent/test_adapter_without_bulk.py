"""An adapter that implements only ApplyBatch (ApplyBatches is optional): the agent driver
falls back to one call per switch, and a failure still says what was applied."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import message_factory

from lightpath.client import channel
from lightpath.domain.southbound import devices
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath.v1 import optical_switch_pb2_grpc
from lightpath_services.common.server import ServiceDefinition, create_server
from lightpath_services.ocs_manager.agent_driver import AgentSwitchDriver, ScopedChange, batches
from lightpath_services.ocs_manager.driver import SwitchDriverError
from lightpath_services.ocs_manager.wiring import wire_change
from lightpath_services.switch_agent.agent import Agent
from lightpath_services.switch_agent.server import OpticalSwitchServicer
from tests.ocs_manager.model import placement


def without_bulk(servicer: OpticalSwitchServicer, server: grpc.aio.Server) -> None:
    """Register every method of the southbound but the optional ApplyBatches, as an adapter
    that lacks it would: gRPC itself then answers UNIMPLEMENTED for it."""
    desc = sb.DESCRIPTOR.services_by_name["OpticalSwitch"]
    handlers = {
        m.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, m.name),
            request_deserializer=message_factory.GetMessageClass(m.input_type).FromString,
            response_serializer=lambda msg: msg.SerializeToString(),
        )
        for m in desc.methods
        if m.name != "ApplyBatches"
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )


async def test_the_driver_falls_back_to_one_call_per_switch():
    fabric = Fabric.build(FabricConfig((2, 2, 2), 8, 2, 24))
    agent = Agent(devices(fabric), settle_s=0.0, faults="otm-1=partial:1")
    server, port = create_server(
        "127.0.0.1:0",
        [
            ServiceDefinition(
                "lightpath.v1.OpticalSwitch",
                OpticalSwitchServicer(agent),
                without_bulk,
            )
        ],
    )
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}", max_attempts=1, credentials=_plaintext()) as ch:
            stub = optical_switch_pb2_grpc.OpticalSwitchStub(ch)
            driver = AgentSwitchDriver(fabric, {d.id: stub for d in devices(fabric)})
            change = wire_change(fabric, placement(fabric, "j", (2, 1, 1), [0, 1]))
            with pytest.raises(SwitchDriverError) as info:
                await driver.apply(change)  # the partial fault on otm-1 fails it
            applied = info.value.applied
            assert isinstance(applied, ScopedChange) and info.value.transient
            # every switch that applied something: the 24 OCS (K = 2), bank 0, bank 1 (half)
            assert applied.banks == {0, 1} and len(applied.ocs) == 24
            assert driver._single_only  # it learnt the endpoint has no ApplyBatches
            await driver.apply(applied.inverse())
            state = await driver.read()
            assert state is not None and not state.tables and not state.one_to_many
            await driver.apply(change)
            state = await driver.read()
            assert state is not None and len(state.tables) == 24
            # a switch behind it came back (restarted, perhaps upgraded): ApplyBatches is
            # asked again, once, and the fallback learnt again (issue 34)
            driver.reconnected("ocs-x-0-0")
            assert not driver._single_only
            calls = driver.apply_calls
            await driver.apply(change.inverse())
            assert driver._single_only
            assert driver.apply_calls == calls + 1 + len(batches(fabric, change))
    finally:
        await server.stop(0)


def _plaintext():
    from lightpath.security.credentials import Credentials

    return Credentials(tls=False)
