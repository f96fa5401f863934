"""Who may call what, over real gRPC, TLS and Redis (issue: security).

The table walk takes every method of every service descriptor, so a new RPC
cannot be served without its row in services/lightpath_services/common/policy.py: anonymous
callers are UNAUTHENTICATED (but for GetInfo), every principal whose role the
row does not name is PERMISSION_DENIED naming the role, and every principal it
names gets past the guard. The services run here with server-only TLS and
bearer tokens (LIGHTPATH_TLS_CLIENT_AUTH=none), the one mode in which a caller
without a credential reaches the guard at all; the mTLS tests below check the
handshake and certificate identities.

Then tenant isolation and pod ownership through the real cell: another tenant's
job is NOT_FOUND and stays as it was, a request field naming another tenant is
PERMISSION_DENIED and creates nothing, a pod's scheduler may not register
another pod, only pod P's scheduler (or an operator) changes pod P's wiring.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import channel, error_report
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal
from lightpath.security.pki import LocalCA
from lightpath.security.tokens import TokenRegistry
from lightpath.v1 import (
    agg_switch_pb2,
    cell_scheduler_pb2,
    common_pb2,
    core_broker_pb2,
    ocs_manager_pb2,
    optical_switch_pb2,
    workload_scheduler_pb2,
)
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import ocs_manager_pb2 as om
from lightpath_services.common.policy import RULES, rule_for
from tests.cell_scheduler.conftest import cell_stack
from tests.helpers import credentials, identity, serve, test_ca

MODULES = {
    "cell_scheduler": cell_scheduler_pb2,
    "workload_scheduler": workload_scheduler_pb2,
    "ocs_manager": ocs_manager_pb2,
    "core_broker": core_broker_pb2,
    "agg_switch": agg_switch_pb2,
    "switch_agent": optical_switch_pb2,
}
SERVICE_NAMES = {
    "cell_scheduler": ("CellScheduler",),
    "workload_scheduler": ("WorkloadScheduler",),
    "ocs_manager": ("OcsManager",),
    "core_broker": ("CoreBroker",),
    "agg_switch": ("AggSwitch",),
    "switch_agent": ("OpticalSwitch", "OpticalSwitchAdmin"),
}
# One of each kind, and services of right and wrong scopes.
PRINCIPALS = [
    "operator:operator",
    "tenant:acme",
    "application:cam",
    "node:n1",
    "service:cell_scheduler",
    "service:workload_scheduler/pod-1",
    "service:workload_scheduler/pod-2",
    "service:ocs_manager/pod-1",
    "service:ocs_manager/pod-2",
    "service:core_broker",
    "service:agg_switch/sub-1",
    "service:console",
]
# What the guard says when it refuses; a servicer's own refusals use other reasons.
GUARD_REASONS = {
    "MISSING_CREDENTIAL",
    "INVALID_CREDENTIAL",
    "MALFORMED_CREDENTIAL",
    "ROLE_REQUIRED",
    "WRONG_SCOPE",
    "NO_AUTHORIZATION_RULE",
}


def _methods() -> list[tuple[str, str, object]]:
    out = []
    for service, module in MODULES.items():
        for name in SERVICE_NAMES[service]:
            desc = module.DESCRIPTOR.services_by_name[name]
            for m in desc.methods:
                out.append((service, f"/{desc.full_name}/{m.name}", m))
    return out


METHODS = _methods()


def test_every_method_of_every_service_has_a_row():
    missing = [path for _, path, _ in METHODS if rule_for(path) is None]
    assert not missing, f"methods without an authorization row: {missing}"
    # and no row names a method that does not exist
    assert set(RULES) == {path for _, path, _ in METHODS}
    # GetInfo is the only public method (health and reflection are public by prefix)
    public = sorted(p for _, p, _ in METHODS if rule_for(p).public)
    assert public == sorted(p for _, p, _ in METHODS if p.endswith("/GetInfo"))
    # the southbound itself has no public method (a switch answers its own controller)
    assert not [
        p for p in RULES if p.startswith("/lightpath.v1.OpticalSwitch/") and RULES[p].public
    ]


@pytest.mark.parametrize(
    ("method", "allowed", "denied"),
    [
        # tenants: their jobs through the cell, nothing of pods, blocks or switches
        ("CellScheduler/SubmitJob", ["tenant:acme", "operator:operator"], ["node:n1"]),
        (
            "CellScheduler/UpdateJob",
            ["tenant:acme", "operator:operator"],
            ["node:n1", "service:workload_scheduler/pod-1"],
        ),
        (
            "WorkloadScheduler/UpdateJob",
            ["service:cell_scheduler", "operator:operator"],
            ["tenant:acme", "service:workload_scheduler/pod-1"],
        ),
        (
            "CellScheduler/ReportBlockHealth",
            ["operator:operator"],
            ["tenant:acme", "service:workload_scheduler/pod-1"],
        ),
        (
            "CellScheduler/RegisterPod",
            ["service:workload_scheduler/pod-1", "operator:operator"],
            ["tenant:acme", "service:cell_scheduler"],
        ),
        ("CellScheduler/ListPods", ["operator:operator"], ["tenant:acme"]),
        # tenants' quotas (issue 35): operators set and delete them; a tenant reads (its
        # own row only: test_quota_service); the console reads, writes nothing
        (
            "CellScheduler/SetQuota",
            ["operator:operator"],
            ["tenant:acme", "service:console", "service:workload_scheduler/pod-1"],
        ),
        (
            "CellScheduler/DeleteQuota",
            ["operator:operator"],
            ["tenant:acme", "service:console", "node:n1"],
        ),
        (
            "CellScheduler/ListQuotas",
            ["tenant:acme", "operator:operator", "service:console"],
            ["node:n1", "application:cam", "service:workload_scheduler/pod-1"],
        ),
        # only pod P's scheduler (or an operator) wires pod P
        (
            "OcsManager/WireSlice",
            ["service:workload_scheduler/pod-1", "operator:operator"],
            ["service:workload_scheduler/pod-2", "tenant:acme", "service:cell_scheduler"],
        ),
        (
            "OcsManager/ReserveRings",
            ["service:workload_scheduler/pod-1"],
            ["service:workload_scheduler/pod-2", "tenant:acme"],
        ),
        (
            "WorkloadScheduler/AdmitJob",
            ["service:cell_scheduler", "operator:operator"],
            ["tenant:acme", "service:workload_scheduler/pod-1"],
        ),
        # aggregation data path: nodes and switches only
        ("AggSwitch/Contribute", ["node:n1"], ["tenant:acme", "operator:operator"]),
        ("AggSwitch/Relay", ["service:agg_switch/sub-1"], ["node:n1", "operator:operator"]),
        ("AggSwitch/DefineTopology", ["operator:operator"], ["tenant:acme", "node:n1"]),
        # a command's owner, an operator or a participant may fail it across the tree
        (
            "AggSwitch/AbortCommand",
            ["operator:operator", "tenant:acme", "node:n1"],
            ["service:agg_switch/sub-1", "application:cam"],
        ),
        # the southbound: only the pod's own ocs_manager programs its switches; an operator
        # may look and inject faults, nobody else
        (
            "OpticalSwitch/ApplyBatch",
            ["service:ocs_manager/pod-1"],
            ["service:ocs_manager/pod-2", "operator:operator", "service:workload_scheduler/pod-1"],
        ),
        (
            "OpticalSwitch/GetCrossConnects",
            ["service:ocs_manager/pod-1", "operator:operator"],
            ["service:ocs_manager/pod-2", "tenant:acme"],
        ),
        (
            "OpticalSwitchAdmin/InjectFault",
            ["operator:operator"],
            ["service:ocs_manager/pod-1", "tenant:acme"],
        ),
        # core broker: as before, operators manage, applications reserve
        ("CoreBroker/RegisterDevice", ["operator:operator"], ["application:cam", "tenant:acme"]),
        ("CoreBroker/Reserve", ["application:cam"], ["operator:operator", "tenant:acme"]),
        # the web console (issue 21): a read-only operator, of every pod, writing nothing
        ("CellScheduler/ListPods", ["service:console"], ["node:n1"]),
        ("CellScheduler/WatchPod", ["service:console"], ["tenant:acme"]),
        ("OcsManager/ListSwitches", ["service:console"], ["service:workload_scheduler/pod-2"]),
        ("CoreBroker/QueryCapacity", ["service:console"], ["tenant:acme"]),
        ("AggSwitch/GetSwitchState", ["service:console"], ["tenant:acme"]),
        ("CellScheduler/SubmitJob", [], ["service:console"]),
        ("CellScheduler/ReportBlockHealth", [], ["service:console"]),
        ("OcsManager/WireSlice", [], ["service:console"]),
        ("CoreBroker/RegisterDevice", [], ["service:console"]),
        ("CoreBroker/ReleaseReservation", [], ["service:console"]),
        ("AggSwitch/DefineTopology", [], ["service:console"]),
        # graph runs: an application runs its reserved graphs; operators watch and stop them
        ("CoreBroker/RunGraph", ["application:cam"], ["operator:operator", "tenant:acme"]),
        (
            "CoreBroker/CancelGraphRun",
            ["application:cam", "operator:operator"],
            ["tenant:acme", "node:n1"],
        ),
        ("CoreBroker/GetGraphRun", ["application:cam", "operator:operator"], ["tenant:acme"]),
    ],
)
def test_the_roles_the_issue_names(method, allowed, denied):
    path = f"/lightpath.v1.{method}"
    for p in allowed:
        assert _allowed(path, Principal.parse(p)), f"{p} must be allowed {method}"
    for p in denied:
        assert not _allowed(path, Principal.parse(p)), f"{p} must not be allowed {method}"


def _allowed(path: str, principal: Principal) -> bool:
    rule = rule_for(path)
    assert rule is not None
    role = (
        f"service:{principal.name.split('/')[0]}" if principal.kind == "service" else principal.kind
    )
    if role not in rule.roles:
        return False
    return not (
        rule.same_scope
        and principal.kind == "service"
        and principal.scope() != "pod-1"
        and role != "service:console"  # the console reads every pod
    )


async def _call(ch: grpc.aio.Channel, path: str, method) -> grpc.aio.AioRpcError | None:
    """Call `path` with an empty request; the error it ends with, or None."""
    req_cls = message_factory.GetMessageClass(method.input_type)
    resp_cls = message_factory.GetMessageClass(method.output_type)
    kw = {
        "request_serializer": req_cls.SerializeToString,
        "response_deserializer": resp_cls.FromString,
    }
    try:
        if method.client_streaming and method.server_streaming:
            call = ch.stream_stream(path, **kw)(iter([req_cls()]), timeout=5)
            async for _ in call:
                break
        elif method.client_streaming:
            await ch.stream_unary(path, **kw)(iter([req_cls()]), timeout=5)
        elif method.server_streaming:
            call = ch.unary_stream(path, **kw)(req_cls(), timeout=1)
            async for _ in call:
                break
            call.cancel()
        else:
            await ch.unary_unary(path, **kw)(req_cls(), timeout=5)
    except grpc.aio.AioRpcError as err:
        return err
    return None


def _token_client(token: str) -> Credentials:
    """Server-only TLS (trusting the test CA), no client certificate, maybe a token."""
    return Credentials(ca=test_ca().cert_path.read_bytes(), token=token, tls=True)


@contextlib.asynccontextmanager
async def _token_mode_services(redis_url: str, tmp: Path) -> AsyncIterator[dict[str, str]]:
    """All five services, server-only TLS, callers (and the services' own calls) by token."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    registry = TokenRegistry(client)

    async def token_file(principal: str) -> str:
        _, token = await registry.issue(Principal.parse(principal))
        path = tmp / f"{principal.replace(':', '-').replace('/', '-')}.token"
        path.write_text(token)
        return str(path)

    base = {"LIGHTPATH_TLS_CLIENT_AUTH": "none"}
    async with contextlib.AsyncExitStack() as stack:
        ocs = await stack.enter_async_context(
            serve(
                "ocs_manager",
                redis_url,
                {
                    **base,
                    "LIGHTPATH_POD_ID": "pod-1",
                    "LIGHTPATH_FABRIC_BLOCKS": "8",
                    "LIGHTPATH_TOKEN_FILE": await token_file("service:ocs_manager/pod-1"),
                },
            )
        )
        ws = await stack.enter_async_context(
            serve(
                "workload_scheduler",
                redis_url,
                {
                    **base,
                    "LIGHTPATH_POD_ID": "pod-1",
                    "LIGHTPATH_OCS_ADDR": ocs.address,
                    "LIGHTPATH_TOKEN_FILE": await token_file("service:workload_scheduler/pod-1"),
                },
            )
        )
        others = {}
        for service in ("cell_scheduler", "core_broker", "agg_switch"):
            svc = await stack.enter_async_context(serve(service, redis_url, base))
            others[service] = svc.address
        agent = await stack.enter_async_context(
            serve(
                "switch_agent",
                redis_url,
                {**base, "LIGHTPATH_POD_ID": "pod-1", "LIGHTPATH_FABRIC_BLOCKS": "8"},
            )
        )
        others["switch_agent"] = agent.address
        try:
            yield {
                "ocs_manager": ocs.address,
                "workload_scheduler": ws.address,
                **others,
            }
        finally:
            await client.aclose()


async def test_the_table_walk_every_method_every_role(redis_url, tmp_path):
    async with _token_mode_services(redis_url, tmp_path) as addresses:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        registry = TokenRegistry(client)
        tokens = {p: (await registry.issue(Principal.parse(p)))[1] for p in PRINCIPALS}
        await client.aclose()
        # the broker knows its applications: the operator registers "cam" first
        from lightpath.v1 import core_broker_pb2_grpc

        async with channel(
            addresses["core_broker"], credentials=_token_client(tokens["operator:operator"])
        ) as ch:
            await core_broker_pb2_grpc.CoreBrokerStub(ch).RegisterApplication(
                core_broker_pb2.RegisterApplicationRequest(application_id="cam")
            )
        failures: list[str] = []
        async with contextlib.AsyncExitStack() as stack:
            anonymous = {
                s: await stack.enter_async_context(
                    channel(a, credentials=_token_client(""), max_attempts=1)
                )
                for s, a in addresses.items()
            }
            forged = {
                s: await stack.enter_async_context(
                    channel(a, credentials=_token_client("lpt1.00.forged"), max_attempts=1)
                )
                for s, a in addresses.items()
            }
            as_principal = {
                (p, s): await stack.enter_async_context(
                    channel(a, credentials=_token_client(tokens[p]), max_attempts=1)
                )
                for p in PRINCIPALS
                for s, a in addresses.items()
            }
            for service, path, method in METHODS:
                public = rule_for(path).public
                for label, ch in (("anonymous", anonymous[service]), ("forged", forged[service])):
                    err = await _call(ch, path, method)
                    if public:
                        if err is not None and err.code() in (
                            grpc.StatusCode.UNAUTHENTICATED,
                            grpc.StatusCode.PERMISSION_DENIED,
                        ):
                            failures.append(f"{label} {path}: {err.code().name} on a public method")
                    elif err is None or err.code() != grpc.StatusCode.UNAUTHENTICATED:
                        failures.append(f"{label} {path}: {err and err.code().name}")
                    elif label == "anonymous" and "Bearer" not in (err.details() or ""):
                        failures.append(f"{path}: the message does not say what is expected")
                for p in PRINCIPALS:
                    principal = Principal.parse(p)
                    err = await _call(as_principal[(p, service)], path, method)
                    report = error_report(err) if err is not None else None
                    if public or _allowed(path, principal):
                        if report is not None and (
                            report.code == grpc.StatusCode.UNAUTHENTICATED
                            or report.reason in GUARD_REASONS
                        ):
                            failures.append(f"{p} {path}: refused ({report}) though its role may")
                    elif (
                        report is None
                        or report.code != grpc.StatusCode.PERMISSION_DENIED
                        or report.reason not in {"ROLE_REQUIRED", "WRONG_SCOPE"}
                    ):
                        failures.append(f"{p} {path}: {report} (want PERMISSION_DENIED)")
                    elif report.reason == "ROLE_REQUIRED" and rule_for(
                        path
                    ).describe_roles() not in (report.message):
                        failures.append(f"{p} {path}: the message does not name the role")
        assert not failures, "\n".join(failures)


# -- mTLS: the handshake, and identities from certificates ---------------------


async def test_mtls_refuses_other_cas_and_missing_certificates_at_the_handshake(
    redis_url, tmp_path
):
    other = LocalCA(tmp_path / "other-ca").ensure().issue(Principal("operator", "operator"))
    ours = test_ca().cert_path.read_bytes()
    async with serve("cell_scheduler", redis_url) as svc:
        cases = {
            "a certificate from another CA": Credentials(
                ca=ours, cert=other.cert.read_bytes(), key=other.key.read_bytes(), tls=True
            ),
            "no certificate": Credentials(ca=ours, tls=True),
            "plaintext": Credentials(),
        }
        for what, creds in cases.items():
            async with channel(svc.address, credentials=creds, max_attempts=1) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(), timeout=3
                    )
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
        # the same call with a certificate of our CA is served
        async with channel(svc.address, credentials=credentials("tenant:acme")) as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_certificate_names_the_caller_and_a_bad_token_beside_it_is_refused(redis_url):
    async with serve("cell_scheduler", redis_url) as svc:
        async with channel(svc.address, credentials=credentials("tenant:acme")) as ch:
            err = await _call(ch, "/lightpath.v1.CellScheduler/ListPods", _method("ListPods"))
            report = error_report(err)
            assert report.code == grpc.StatusCode.PERMISSION_DENIED
            assert "tenant:acme" in report.message and "operator" in report.message
        bad = credentials("operator:operator", token="lpt1.0011.not-a-secret")
        async with channel(svc.address, credentials=bad) as ch:
            err = await _call(ch, "/lightpath.v1.CellScheduler/ListPods", _method("ListPods"))
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_report(err).reason == "INVALID_CREDENTIAL"
        malformed = Credentials.from_files(
            *(lambda f: (f.ca, f.cert, f.key))(identity("operator:operator"))
        )
        async with channel(svc.address, credentials=malformed) as ch:
            call = cs.ListPodsRequest()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(
                    "/lightpath.v1.CellScheduler/ListPods",
                    request_serializer=cs.ListPodsRequest.SerializeToString,
                    response_deserializer=cs.ListPodsResponse.FromString,
                )(call, metadata=(("authorization", "Basic abc"),))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in info.value.details()


def _method(name: str):
    return cell_scheduler_pb2.DESCRIPTOR.services_by_name["CellScheduler"].methods_by_name[name]


async def test_a_revoked_token_stops_working(redis_url, tmp_path):
    async with _token_mode_services(redis_url, tmp_path) as addresses:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        registry = TokenRegistry(client, cache_s=0)
        token_id, token = await registry.issue(Principal("operator", "operator"))
        async with channel(addresses["cell_scheduler"], credentials=_token_client(token)) as ch:
            list_pods = _method("ListPods")
            assert await _call(ch, "/lightpath.v1.CellScheduler/ListPods", list_pods) is None
            assert await registry.revoke(token_id)
            # the service trusts a verified token for at most 2 s (its cache)
            for _ in range(40):
                err = await _call(ch, "/lightpath.v1.CellScheduler/ListPods", list_pods)
                if err is not None:
                    break
                import asyncio

                await asyncio.sleep(0.1)
            assert err is not None and err.code() == grpc.StatusCode.UNAUTHENTICATED
        await client.aclose()


# -- tenants and pods through the real cell ------------------------------------


async def test_tenants_see_and_touch_only_their_own_jobs(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),)) as cell:
        address = cell.cell_addresses[0]
        async with (
            channel(address, credentials=credentials("tenant:acme")) as acme_ch,
            channel(address, credentials=credentials("tenant:beta")) as beta_ch,
        ):
            from lightpath.v1 import cell_scheduler_pb2_grpc
            from lightpath.v1 import workload_scheduler_pb2 as ws

            acme = cell_scheduler_pb2_grpc.CellSchedulerStub(acme_ch)
            beta = cell_scheduler_pb2_grpc.CellSchedulerStub(beta_ch)
            shape = common_pb2.Shape(dims=[4, 4, 4])
            # the tenant comes from the credential: an empty field is filled in
            sub = await acme.SubmitJob(
                cs.SubmitJobRequest(spec=ws.JobSpec(job_id="acme-1", shape=shape))
            )
            assert sub.job.tenant == "acme"
            # a field naming another tenant is refused, and nothing is created
            err = await _rpc_error(
                acme.SubmitJob(
                    cs.SubmitJobRequest(
                        spec=ws.JobSpec(job_id="acme-2", shape=shape), tenant="beta"
                    )
                )
            )
            assert err.code == grpc.StatusCode.PERMISSION_DENIED and "tenant" in err.message
            assert (await _rpc_error(cell.job("acme-2"))).code == grpc.StatusCode.NOT_FOUND
            # another tenant cannot read, watch, update, cancel or complete it
            bump = cs.UpdateCellJobRequest(spec=ws.JobSpec(job_id="acme-1", priority=90))
            bump.update_mask.paths.append("priority")
            for call in (
                beta.GetJob(cs.GetCellJobRequest(job_id="acme-1")),
                beta.UpdateJob(bump),
                beta.CancelJob(cs.CancelCellJobRequest(job_id="acme-1")),
                beta.CompleteJob(cs.CompleteCellJobRequest(job_id="acme-1")),
            ):
                assert (await _rpc_error(call)).code == grpc.StatusCode.NOT_FOUND
            watch = beta.WatchJob(cs.WatchCellJobRequest(job_id="acme-1"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in watch:
                    break
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            # ... nor take its id
            err = await _rpc_error(
                beta.SubmitJob(cs.SubmitJobRequest(spec=ws.JobSpec(job_id="acme-1", shape=shape)))
            )
            assert err.code == grpc.StatusCode.PERMISSION_DENIED
            # and the refusal says only that the id cannot be used, not whose it is
            assert err.reason == "ID_UNAVAILABLE" and "tenant" not in err.message, err
            job = await cell.job("acme-1")  # the operator's view
            assert job.tenant == "acme" and job.state == common_pb2.JOB_STATE_RUNNING
            # lists are scoped: beta sees nothing of acme's, acme sees its own
            await beta.SubmitJob(cs.SubmitJobRequest(spec=ws.JobSpec(job_id="beta-1", shape=shape)))
            beta_jobs = await beta.ListJobs(cs.ListCellJobsRequest())
            assert [j.job_id for j in beta_jobs.jobs] == ["beta-1"]
            acme_jobs = await acme.ListJobs(cs.ListCellJobsRequest())
            assert [j.job_id for j in acme_jobs.jobs] == ["acme-1"]
            assert (
                await _rpc_error(beta.ListJobs(cs.ListCellJobsRequest(tenant="acme")))
            ).code == grpc.StatusCode.PERMISSION_DENIED
            everyone = await cell.cell.ListJobs(cs.ListCellJobsRequest())
            assert {j.job_id for j in everyone.jobs} == {"acme-1", "beta-1"}
            # the owner may update and cancel its own (beta's attempt changed nothing)
            assert (await cell.job("acme-1")).priority == 50
            assert (await acme.UpdateJob(bump)).priority == 90
            done = await acme.CancelJob(cs.CancelCellJobRequest(job_id="acme-1"))
            assert done.job_id == "acme-1"


async def test_a_pods_scheduler_registers_and_reports_only_its_own_pod(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),)) as cell:
        before = await cell.pods_view()
        async with channel(
            cell.cell_addresses[0], credentials=credentials("service:workload_scheduler/pod-b")
        ) as ch:
            from lightpath.v1 import cell_scheduler_pb2_grpc

            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            reg = cs.PodRegistration(pod_id="pod-a", endpoint="127.0.0.1:1")
            err = await _rpc_error(stub.RegisterPod(cs.RegisterPodRequest(pod=reg)))
            assert err.code == grpc.StatusCode.PERMISSION_DENIED and "pod-a" in err.message
            err = await _rpc_error(stub.ReportPodStatus(cs.ReportPodStatusRequest(pod_id="pod-a")))
            assert err.code == grpc.StatusCode.PERMISSION_DENIED
        after = await cell.pods_view()
        assert after["pod-a"].registration.endpoint == before["pod-a"].registration.endpoint


async def test_only_the_pods_own_scheduler_changes_its_wiring(redis_url):
    async with cell_stack(redis_url, pods=(("pod-a", 8, "tpu"),)) as cell:
        await cell.submit("wired", (8, 4, 4))
        pod = cell.pods["pod-a"]
        before = await pod.wiring("wired")
        assert before is not None and before.cross_connects
        address = cell.ocs_addresses["ocs-pod-a"]
        for who in ("service:workload_scheduler/pod-b", "tenant:acme", "service:cell_scheduler"):
            async with channel(address, credentials=credentials(who), max_attempts=1) as ch:
                from lightpath.v1 import ocs_manager_pb2_grpc

                stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                err = await _rpc_error(stub.ReleaseSlice(om.ReleaseSliceRequest(job_id="wired")))
                assert err.code == grpc.StatusCode.PERMISSION_DENIED, who
        after = await pod.wiring("wired")
        assert after is not None and len(after.cross_connects) == len(before.cross_connects)
        job = await cell.job("wired")
        assert job.state == common_pb2.JOB_STATE_RUNNING


async def _rpc_error(awaitable):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return error_report(info.value)


def _foreign_identity_cert(tmp_path: Path, uri: str | None) -> Credentials:
    """A certificate from the tests' CA whose URI SAN is not a Lightpath identity."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca = test_ca()
    ca_cert = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key_path.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
    if uri:
        sans.append(x509.UniformResourceIdentifier(uri))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Credentials(
        ca.cert_path.read_bytes(),
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        tls=True,
    )


@pytest.mark.parametrize(
    "uri", [None, "spiffe://other-domain/tenant/acme", "spiffe://lightpath/king/x"]
)
async def test_a_certificate_without_a_lightpath_identity_is_unauthenticated(
    redis_url, tmp_path, uri
):
    async with (
        serve("cell_scheduler", redis_url) as svc,
        channel(svc.address, credentials=_foreign_identity_cert(tmp_path, uri)) as ch,
    ):
        err = await _call(ch, "/lightpath.v1.CellScheduler/ListJobs", _method("ListJobs"))
        report = error_report(err)
        assert report.code == grpc.StatusCode.UNAUTHENTICATED
        assert report.reason == "UNKNOWN_IDENTITY" and "spiffe://lightpath/" in report.message


def test_the_console_may_only_read():
    """Every row naming the console is a read (never audited as a change), and no
    mutating method of any service names it: its identity cannot change anything."""
    console_rows = [p for p, rule in RULES.items() if "service:console" in rule.roles]
    assert console_rows
    assert all(not RULES[p].audit for p in console_rows), "the console holds a write row"
    names = {p.rsplit("/", 1)[1] for p in console_rows}
    assert all(n.startswith(("Get", "List", "Watch", "Query", "Check", "Plan")) for n in names)
