"""`lightpath up --switch-agents` (issue 20): the local stack runs each OCS pod's switches as
a switch agent process with its own certificate, and the pod's ocs_manager programs them."""

from __future__ import annotations

from lightpath.client import channel
from lightpath.stack import Stack, default_topology, with_ephemeral_ports
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc, optical_switch_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import optical_switch_pb2 as sb
from tests.ocs_manager.conftest import wire_request


def test_the_topology_with_agents_points_each_manager_at_its_pods_agent():
    plain = {s.name: s for s in default_topology()}
    agents = {s.name: s for s in default_topology(switch_agents=True)}
    assert set(agents) - set(plain) == {"switches-pod-1", "switches-pod-2"}
    for pod in ("pod-1", "pod-2"):
        agent, ocs = agents[f"switches-{pod}"], agents[f"ocs-{pod}"]
        assert str(agent.principal) == f"service:switch_agent/{pod}"
        assert ocs.peers == {"LIGHTPATH_OCS_SWITCH_AGENTS": agent.name}
        # the agent serves the manager's fabric
        for var, value in ocs.env.items():
            if var.startswith("LIGHTPATH_FABRIC_"):
                assert agent.env[var] == value
        assert "LIGHTPATH_OCS_SWITCH_AGENTS" not in plain[f"ocs-{pod}"].peers
    names = list(agents)
    assert names.index("switches-pod-1") < names.index("ocs-pod-1")  # started first


def test_a_process_is_started_once_the_processes_it_points_at_are_healthy(tmp_path, monkeypatch):
    """Started together, the ocs_manager asked its agent before that listened; its refused
    channel then failed the first WireSlice fast although both were healthy (the stack's
    start order, not a race with the host's load)."""
    import lightpath.stack as stack_module

    specs = [s for s in with_ephemeral_ports(default_topology(switch_agents=True))]
    stack = Stack(tmp_path, specs=specs, redis_url="redis://127.0.0.1:1", log=lambda *_: None)
    by_port = {s.port: s.name for s in specs}
    events: list[tuple[str, str]] = []
    probes: dict[str, int] = {}

    class Running:
        def poll(self):
            return None

    def spawn(spec):
        events.append(("spawn", spec.name))
        stack.procs[spec.name] = Running()  # type: ignore[assignment]

    def health(address, timeout, credentials):
        name = by_port[int(address.rsplit(":", 1)[1])]
        probes[name] = probes.get(name, 0) + 1
        if probes[name] < 3:  # healthy on its third probe
            return "NOT_SERVING"
        if ("healthy", name) not in events:
            events.append(("healthy", name))
        return "SERVING"

    monkeypatch.setattr(stack, "_spawn", spawn)
    monkeypatch.setattr(Stack, "operator", property(lambda _self: None))
    monkeypatch.setattr(stack_module, "health_status", health)
    monkeypatch.setattr(stack_module.time, "sleep", lambda _s: None)
    stack._start_in_order(timeout=60)
    assert {n for e, n in events if e == "healthy"} == {s.name for s in specs}
    for spec in specs:
        spawned = events.index(("spawn", spec.name))
        for peer in set(spec.peers.values()) - {spec.name}:
            assert events.index(("healthy", peer)) < spawned, (spec.name, peer, events)
    # and not one at a time: all that point at no other start before any is healthy
    free = {s.name for s in specs if not set(s.peers.values()) - {s.name}}
    first_healthy = next(i for i, (e, _) in enumerate(events) if e == "healthy")
    assert free == {n for e, n in events[:first_healthy] if e == "spawn"}, events
    assert {"cell-scheduler", "switches-pod-1", "switches-pod-2"} <= free


async def test_a_stack_with_agents_wires_through_them(tmp_path, redis_url):
    keep = {"switches-pod-2", "ocs-pod-2"}
    specs = [
        s for s in with_ephemeral_ports(default_topology(switch_agents=True)) if s.name in keep
    ]
    stack = Stack(tmp_path, specs=specs, redis_url=redis_url, log=lambda *_: None)
    stack.start(timeout=120)
    try:
        creds = stack.operator
        ocs_addr, agent_addr = stack.endpoints["ocs-pod-2"], stack.endpoints["switches-pod-2"]
        async with channel(ocs_addr, credentials=creds, max_attempts=1) as ch:
            ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
            info = await ocs.GetInfo(common_pb2.GetInfoRequest())
            assert info.attributes["switch_driver"] == "agents"
            await ocs.WireSlice(wire_request("s", [2, 2, 1], [0, 1, 2, 3]))
            report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
            assert report.ok, list(report.violations)
        async with channel(agent_addr, credentials=creds, max_attempts=1) as ch:
            state = await optical_switch_pb2_grpc.OpticalSwitchStub(ch).GetCrossConnects(
                sb.GetCrossConnectsRequest(switch_id="otm-1")
            )
            assert len(state.outputs) == 48  # block 1 on all 3 dims (z: a self-loop), 16 axes each
            stats = await optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch).GetSwitchStats(
                sb.GetSwitchStatsRequest()
            )
            assert stats.batches_applied > 0
    finally:
        stack.stop()
