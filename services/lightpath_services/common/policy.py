"""Who may call what: one row per RPC of every Lightpath service.

The server factory looks every call up here before the servicer runs
(lightpath_services.common.auth.Guard). A method with no row is refused, and
tests/test_authorization.py walks every method of every service descriptor,
so a new RPC cannot be served until it has its row.

Roles:
  operator, tenant, application, node   a principal of that kind
  service:<name>                        a process of that Lightpath service
  service:console                       the web console's own identity (issue 21): it is
                                        named in read rows only, so it is a read-only
                                        operator; `same_scope` rows take it from any scope
                                        (it shows every pod)
Rows marked `same_scope` take a scoped service caller only from the same
scope as this server: only the workload_scheduler of pod P reaches pod P's
ocs_manager. Per-resource checks (a tenant's own jobs, a pod's own
registration, a node's own chunks) are the servicers', through
`lightpath_services.common.auth.caller()`.

`audit`: written to the audit log at Metadata level: every mutating call but the
pods' heartbeats (ReportPodStatus) and nodes' load reports (ReportLoad), which
come every second, and the aggregation data path (Contribute, Relay: chunks,
thousands a second), which would drown the rest (docs/security.md lists them).
Denied calls are always written.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightpath.security.identity import APPLICATION, NODE, OPERATOR, TENANT

CELL = "service:cell_scheduler"
WS = "service:workload_scheduler"
AGG = "service:agg_switch"
OCS = "service:ocs_manager"
CONSOLE = "service:console"
# Roles a `same_scope` row takes whatever their scope (they serve no pod or switch).
UNSCOPED_ROLES = frozenset({CONSOLE})


@dataclass(frozen=True)
class Rule:
    roles: frozenset[str] = frozenset()
    public: bool = False  # anyone, even without a credential
    audit: bool = False
    same_scope: bool = False

    def describe_roles(self) -> str:
        return " or ".join(sorted(self.roles)) or "nobody"


PUBLIC = Rule(public=True)


def read(*roles: str, same_scope: bool = False) -> Rule:
    return Rule(frozenset(roles), same_scope=same_scope)


def write(*roles: str, same_scope: bool = False, audit: bool = True) -> Rule:
    return Rule(frozenset(roles), audit=audit, same_scope=same_scope)


_CELL = {
    "GetInfo": PUBLIC,
    "SubmitJob": write(TENANT, OPERATOR),
    "GetJob": read(TENANT, OPERATOR, CONSOLE),
    "ListJobs": read(TENANT, OPERATOR, CONSOLE),
    "CompleteJob": write(TENANT, OPERATOR),
    "CancelJob": write(TENANT, OPERATOR),
    "UpdateJob": write(TENANT, OPERATOR),
    "WatchJob": read(TENANT, OPERATOR, CONSOLE),
    "ReportBlockHealth": write(OPERATOR),
    "ListPods": read(OPERATOR, CONSOLE),
    "GetPod": read(OPERATOR, CONSOLE),
    "WatchPod": read(OPERATOR, CONSOLE),
    "RegisterPod": write(WS, OPERATOR),
    "ReportPodStatus": write(WS, OPERATOR, audit=False),
    # tenants' quotas (issue 35): operators set them; a tenant reads its own
    "SetQuota": write(OPERATOR),
    "DeleteQuota": write(OPERATOR),
    "ListQuotas": read(TENANT, OPERATOR, CONSOLE),
}

_WS = {
    "GetInfo": PUBLIC,
    "AdmitJob": write(CELL, OPERATOR),
    "GetJob": read(CELL, OPERATOR),
    "ListJobs": read(CELL, OPERATOR),
    "CompleteJob": write(CELL, OPERATOR),
    "CancelJob": write(CELL, OPERATOR),
    "UpdateJob": write(CELL, OPERATOR),
    "ReportBlockHealth": write(CELL, OPERATOR),
    "WatchJob": read(CELL, OPERATOR),
    "WatchPod": read(CELL, OPERATOR),
    "GetPod": read(CELL, OPERATOR),
    "PlanRings": read(CELL, OPERATOR),
}

_OCS_READS = (
    "GetFabric",
    "PlanFabric",
    "GetPortMap",
    "GetSliceWiring",
    "ListSlices",
    "GetRoutingTable",
    "ListSwitches",
    "GetOneToManyStates",
    "CheckInvariants",
    "GetSwitchedFabric",
    "GetRings",
    "ListRingReservations",
    "ListSwitchLinkUse",
    "GetFreeUplinks",
)
_OCS_WRITES = (
    "WireSlice",
    "ReleaseSlice",
    "ReplaceBlock",
    "ReserveRings",
    "ReleaseRings",
    "SwapGroup",
)
_OCS = {
    "GetInfo": PUBLIC,
    **{m: read(WS, OPERATOR, CONSOLE, same_scope=True) for m in _OCS_READS},
    **{m: write(WS, OPERATOR, same_scope=True) for m in _OCS_WRITES},
}

_BROKER = {
    "GetInfo": PUBLIC,
    "RegisterDevice": write(OPERATOR),
    "RemoveDevice": write(OPERATOR),
    "RegisterApplication": write(OPERATOR),
    "RemoveApplication": write(OPERATOR),
    "SetLatencies": write(OPERATOR),
    "ListDevices": read(APPLICATION, OPERATOR, CONSOLE),
    "QueryCapacity": read(APPLICATION, OPERATOR, CONSOLE),
    "Reserve": write(APPLICATION),
    "BatchReserve": write(APPLICATION),
    "GetReservation": read(APPLICATION, OPERATOR, CONSOLE),
    "ListReservations": read(APPLICATION, OPERATOR, CONSOLE),
    "ReleaseReservation": write(APPLICATION, OPERATOR),
    "ExtendReservation": write(APPLICATION, OPERATOR),
    "WatchReservations": read(APPLICATION, OPERATOR, CONSOLE),
    "PlanGraph": read(APPLICATION, OPERATOR),
    "ReserveGraph": write(APPLICATION),
    "ReportGraphMetrics": write(APPLICATION),
    "GetGraphMetrics": read(APPLICATION, OPERATOR, CONSOLE),
    "RunGraph": write(APPLICATION),
    "GetGraphRun": read(APPLICATION, OPERATOR),
    "CancelGraphRun": write(APPLICATION, OPERATOR),
}

_AGG = {
    "GetInfo": PUBLIC,
    "DefineTopology": write(OPERATOR),
    "GetTopology": read(OPERATOR, TENANT, NODE, AGG, CONSOLE),
    "StartCommand": write(OPERATOR, TENANT),
    "GetCommand": read(OPERATOR, TENANT, NODE, CONSOLE),
    "AbortCommand": write(OPERATOR, TENANT, NODE),
    "ListCommands": read(OPERATOR, TENANT, CONSOLE),
    "ChooseTimeoutAggregator": read(OPERATOR, TENANT),
    "PredictStragglers": read(OPERATOR, TENANT),
    "GetHistory": read(OPERATOR, TENANT, CONSOLE),
    "ReportLoad": write(NODE, AGG, OPERATOR, audit=False),
    "SetParameters": write(OPERATOR, TENANT),
    "GetParameters": read(OPERATOR, TENANT, NODE),
    "GetSwitchState": read(OPERATOR, AGG, CONSOLE),
    # A node joining a command: once per node and command, audited.
    "JoinCommand": write(NODE),
    # The data path (chunks, thousands a second per stream): not audited when allowed
    # (docs/security.md says so); what it does shows in the command's outcome.
    "Contribute": write(NODE, audit=False),
    "Results": read(NODE),
    "Relay": write(AGG, audit=False),
}

# The southbound of a pod's optical switches (optical_switch.proto): only that pod's
# ocs_manager programs them (an operator may look); fault injection on the reference
# agent is an operator's drill.
_SOUTHBOUND = {
    "Describe": read(OCS, OPERATOR, same_scope=True),
    "GetCrossConnects": read(OCS, OPERATOR, same_scope=True),
    "GetPortStatus": read(OCS, OPERATOR, same_scope=True),
    "ApplyBatch": write(OCS, same_scope=True),
    "ApplyBatches": write(OCS, same_scope=True),
}
_SOUTHBOUND_ADMIN = {
    "GetInfo": PUBLIC,
    "InjectFault": write(OPERATOR),
    "RestartSwitch": write(OPERATOR),
    "GetSwitchStats": read(OPERATOR),
}

RULES: dict[str, Rule] = {
    f"/lightpath.v1.{service}/{method}": rule
    for service, table in (
        ("CellScheduler", _CELL),
        ("WorkloadScheduler", _WS),
        ("OcsManager", _OCS),
        ("CoreBroker", _BROKER),
        ("AggSwitch", _AGG),
        ("OpticalSwitch", _SOUTHBOUND),
        ("OpticalSwitchAdmin", _SOUTHBOUND_ADMIN),
    )
    for method, rule in table.items()
}

# Health checking and reflection: for load balancers, probes and grpcurl.
PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


def rule_for(method: str) -> Rule | None:
    if method.startswith(PUBLIC_PREFIXES):
        return PUBLIC
    return RULES.get(method)
