"""Contract tests of core_broker over real gRPC and a real Redis: every RPC and
its errors (X-3), authentication (CB-2), the seed's scenarios (Fig. 2-4),
expiry on the watch stream (CB-6)."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest

from lightpath.v1 import common_pb2
from lightpath.v1 import core_broker_pb2 as pb
from lightpath_services.common.keys import tenant_key
from tests.core_broker.conftest import (
    OP,
    anonymous,
    bearer,
    dur,
    fails,
    running_broker,
    ts,
)

C = grpc.StatusCode


def now_ms() -> int:
    return int(time.time() * 1000)


async def collect(stream, until: set[int], limit: int = 20) -> list[pb.ReservationEvent]:
    """Events of a watch up to and including the first of type `until`."""
    out = []
    async for ev in stream:
        out.append(ev)
        if ev.type in until or len(out) >= limit:
            break
    return out


# -- authentication (CB-2) ---------------------------------------------------------

EVERY_CALL = [
    ("RegisterDevice", pb.RegisterDeviceRequest()),
    ("RemoveDevice", pb.RemoveDeviceRequest(device_id="d")),
    ("RegisterApplication", pb.RegisterApplicationRequest(application_id="a")),
    ("RemoveApplication", pb.RemoveApplicationRequest(application_id="a")),
    ("SetLatencies", pb.SetLatenciesRequest()),
    ("ListDevices", pb.ListDevicesRequest()),
    ("QueryCapacity", pb.QueryCapacityRequest()),
    ("Reserve", pb.ReserveRequest()),
    ("BatchReserve", pb.BatchReserveRequest()),
    ("GetReservation", pb.GetReservationRequest(reservation_id="r")),
    ("ListReservations", pb.ListReservationsRequest()),
    ("ReleaseReservation", pb.ReleaseReservationRequest(reservation_id="r")),
    ("ExtendReservation", pb.ExtendReservationRequest(reservation_id="r")),
]


@pytest.mark.parametrize(("method", "request_"), EVERY_CALL, ids=[m for m, _ in EVERY_CALL])
async def test_every_call_without_a_valid_credential_is_unauthenticated(
    open_broker, method, request_
):
    call = getattr(open_broker.as_(anonymous()), method)
    missing = await fails(call(request_), C.UNAUTHENTICATED)
    assert missing.reason == "MISSING_CREDENTIAL"
    wrong = await fails(call(request_, metadata=bearer("nobody:secret")), C.UNAUTHENTICATED)
    assert wrong.reason == "INVALID_CREDENTIAL"
    malformed = await fails(
        call(request_, metadata=(("authorization", "Basic xyz"),)), C.UNAUTHENTICATED
    )
    assert malformed.reason == "MALFORMED_CREDENTIAL"


async def test_the_watch_stream_needs_a_credential_too(open_broker):
    stub = open_broker.as_(anonymous())
    r = await fails(
        collect(stub.WatchReservations(pb.WatchReservationsRequest()), set()), C.UNAUTHENTICATED
    )
    assert r.reason == "MISSING_CREDENTIAL"


async def test_tokens_alone_work_where_no_certificate_is_asked_for(open_broker):
    """The operator token and application tokens, with no client certificate (server-only TLS)."""
    stub = open_broker.as_(anonymous())
    await stub.RegisterDevice(
        pb.RegisterDeviceRequest(
            device=pb.Device(device_id="gpu-1", kind=pb.DEVICE_KIND_GPU, cores=8)
        ),
        metadata=OP,
    )
    resp = await stub.RegisterApplication(
        pb.RegisterApplicationRequest(application_id="cam"), metadata=OP
    )
    r = await stub.Reserve(
        pb.ReserveRequest(
            request=pb.ReservationRequest(reservation_id="r", cores=2, duration=dur(5))
        ),
        metadata=bearer(resp.token),
    )
    assert (r.application_id, r.outcome) == ("cam", pb.OUTCOME_GRANTED)


async def test_without_a_client_certificate_no_call_gets_through(broker):
    """mTLS (the default): a caller with no certificate is refused at the handshake,
    whatever token it sends."""
    stub = broker.as_(anonymous())
    r = await fails(stub.ListDevices(pb.ListDevicesRequest(), metadata=OP), C.UNAVAILABLE)
    assert r.code == C.UNAVAILABLE


async def test_a_wrong_token_is_unauthenticated_even_over_the_operators_certificate(broker):
    """A token that fails is refused: the call does not fall back to the certificate."""
    app = await broker.app("cam")
    _, secret = app[0][1].removeprefix("Bearer ").split(":", 1)
    for token in ("cam:wrong", f"ghost:{secret}", "lpt1.0123.abc", "no-colon", OP[0][1][7:] + "x"):
        r = await fails(broker.free_now(bearer(token)), C.UNAUTHENTICATED)
        assert r.reason == "INVALID_CREDENTIAL", token
    # the same, over an application's certificate
    cam = broker.as_("application:cam")
    r = await fails(
        cam.ListDevices(pb.ListDevicesRequest(), metadata=bearer("cam:wrong")), C.UNAUTHENTICATED
    )
    assert r.reason == "INVALID_CREDENTIAL"


async def test_getinfo_answers_without_a_credential(open_broker):
    info = await open_broker.as_(anonymous()).GetInfo(common_pb2.GetInfoRequest())
    assert info.service == "lightpath.v1.CoreBroker"


async def test_operator_calls_need_the_operator_and_reservations_an_application(broker):
    app = await broker.app("cam")
    r = await fails(
        broker.stub.RegisterDevice(pb.RegisterDeviceRequest(), metadata=app),
        C.PERMISSION_DENIED,
    )
    # the Guard refuses by the policy table (lightpath_services.common.policy, _BROKER)
    assert r.reason == "ROLE_REQUIRED"
    assert r.message == "application:cam may not call RegisterDevice: it needs the role operator"
    r = await fails(broker.reserve(OP, "r1", 1, 1), C.PERMISSION_DENIED)
    assert r.reason == "ROLE_REQUIRED"
    assert r.message == "operator:operator may not call Reserve: it needs the role application"


async def test_the_operator_certificate_alone_is_the_operator(redis_url, caplog):
    """No operator token at all: the operator's certificate registers devices and
    applications, sets latencies and sees every reservation."""
    caplog.set_level(logging.INFO, logger="lightpath.core_broker")
    async with running_broker(redis_url, LIGHTPATH_CB_OPERATOR_TOKEN="") as b:
        assert any(
            "LIGHTPATH_CB_OPERATOR_TOKEN is empty" in rec.message
            and "operator certificate" in rec.message
            and rec.levelno == logging.INFO
            for rec in caplog.records
        )
        s = b.stub  # the operator's certificate, no metadata
        await s.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(
                    device_id="gpu-1",
                    kind=pb.DEVICE_KIND_GPU,
                    cores=8,
                    location=pb.Location(site="edge-a"),
                )
            )
        )
        await s.SetLatencies(
            pb.SetLatenciesRequest(
                latencies=[pb.Latency(site="edge-a", device_id="gpu-1", latency_ms=2)]
            )
        )
        resp = await s.RegisterApplication(pb.RegisterApplicationRequest(application_id="cam"))
        await b.reserve(bearer(resp.token), "r-1", 3, 30)
        every = await s.ListReservations(pb.ListReservationsRequest())
        assert [r.application_id for r in every.reservations] == ["cam"]
        cap = await s.QueryCapacity(pb.QueryCapacityRequest(include_schedule=True))
        assert [row.reservation_id for row in cap.devices[0].schedule] == ["r-1"]
        released = await s.ReleaseReservation(pb.ReleaseReservationRequest(reservation_id="r-1"))
        assert released.state == pb.RESERVATION_STATE_RELEASED
        # an operator certificate of another name is an operator too
        alice = b.as_("operator:alice")
        await alice.RemoveDevice(pb.RemoveDeviceRequest(device_id="gpu-1"))
        # with no operator token set, the old one is just an unknown token
        r = await fails(b.free_now(OP), C.UNAUTHENTICATED)
        assert r.reason == "INVALID_CREDENTIAL"


async def test_without_client_certificates_the_empty_operator_token_is_warned_about(
    redis_url, caplog
):
    caplog.set_level(logging.INFO, logger="lightpath.core_broker")
    async with running_broker(
        redis_url, LIGHTPATH_CB_OPERATOR_TOKEN="", LIGHTPATH_TLS_CLIENT_AUTH="none"
    ):
        (warning,) = [
            r for r in caplog.records if "LIGHTPATH_CB_OPERATOR_TOKEN is empty" in r.message
        ]
        assert warning.levelno == logging.WARNING
        assert "operator certificate" in warning.message


async def test_lightpath_tokens_of_operators_and_applications_work_on_the_broker(
    broker, redis_client
):
    """Tokens from the cell's token registry (`lightpath token create KIND:NAME`) name
    operators and applications here as certificates do."""
    from lightpath.security.identity import Principal
    from lightpath.security.tokens import TokenRegistry

    registry = TokenRegistry(redis_client)
    _, alice = await registry.issue(Principal("operator", "alice"))
    _, cam = await registry.issue(Principal("application", "cam"))
    _, acme = await registry.issue(Principal("tenant", "acme"))
    tenant = broker.as_("tenant:acme")  # a certificate that alone may not call the broker
    await tenant.RegisterDevice(
        pb.RegisterDeviceRequest(
            device=pb.Device(device_id="gpu-1", kind=pb.DEVICE_KIND_GPU, cores=4)
        ),
        metadata=bearer(alice),
    )
    # the application must be registered with the broker, whatever its credential
    r = await fails(
        tenant.ListDevices(pb.ListDevicesRequest(), metadata=bearer(cam)), C.UNAUTHENTICATED
    )
    assert r.reason == "UNKNOWN_APPLICATION"
    await broker.app("cam")
    got = await broker.reserve(bearer(cam), "r-1", 1, 5)
    assert got.application_id == "cam"
    r = await fails(broker.free_now(bearer(acme)), C.PERMISSION_DENIED)
    assert r.reason == "ROLE_REQUIRED"


async def test_an_application_certificate_is_that_application(broker):
    await broker.device("gpu-1", 16)
    await broker.stub.RegisterApplication(
        pb.RegisterApplicationRequest(application_id="cam", qos_level=pb.QOS_LEVEL_STANDARD),
        metadata=OP,
    )
    other = await broker.app("other")
    cam = broker.as_("application:cam")  # no token: the certificate names it
    r = await cam.Reserve(
        pb.ReserveRequest(
            request=pb.ReservationRequest(reservation_id="r-cam", cores=4, duration=dur(30))
        )
    )
    assert (r.application_id, r.outcome) == ("cam", pb.OUTCOME_GRANTED)
    # its agreement is the registered one
    r = await fails(
        cam.Reserve(
            pb.ReserveRequest(
                request=pb.ReservationRequest(
                    reservation_id="r-2", cores=1, duration=dur(1), qos_level=pb.QOS_LEVEL_PREMIUM
                )
            )
        ),
        C.PERMISSION_DENIED,
    )
    assert r.reason == "QOS_ABOVE_AGREEMENT"
    # the cross-application checks hold for certificates as for tokens
    await broker.reserve(other, "r-other", 2, 30)
    for call in (  # another application's: not there for cam (issue 30)
        cam.GetReservation(pb.GetReservationRequest(reservation_id="r-other")),
        cam.ReleaseReservation(pb.ReleaseReservationRequest(reservation_id="r-other")),
    ):
        await fails(call, C.NOT_FOUND)
    await fails(
        cam.ListReservations(pb.ListReservationsRequest(application_id="other")),
        C.PERMISSION_DENIED,
    )
    mine = await cam.ListReservations(pb.ListReservationsRequest())
    assert [x.reservation_id for x in mine.reservations] == ["r-cam"]
    cap = await cam.QueryCapacity(pb.QueryCapacityRequest(include_schedule=True))
    assert sorted(row.reservation_id for row in cap.devices[0].schedule) == ["", "r-cam"]
    r = await fails(cam.RegisterDevice(pb.RegisterDeviceRequest()), C.PERMISSION_DENIED)
    assert r.reason == "ROLE_REQUIRED"
    # a token sent over the certificate names the caller
    as_other = await cam.ListReservations(pb.ListReservationsRequest(), metadata=other)
    assert [x.reservation_id for x in as_other.reservations] == ["r-other"]

    # removed: the certificate no longer gets in; registered again (premium now): it does
    await broker.stub.RemoveApplication(
        pb.RemoveApplicationRequest(application_id="cam"), metadata=OP
    )
    r = await fails(cam.ListDevices(pb.ListDevicesRequest()), C.UNAUTHENTICATED)
    assert r.reason == "UNKNOWN_APPLICATION" and '"cam" is not registered' in r.message
    await broker.app("cam", qos=pb.QOS_LEVEL_PREMIUM)
    r = await cam.Reserve(
        pb.ReserveRequest(
            request=pb.ReservationRequest(
                reservation_id="r-3", cores=1, duration=dur(5), qos_level=pb.QOS_LEVEL_PREMIUM
            )
        )
    )
    assert r.outcome == pb.OUTCOME_GRANTED


async def test_an_unregistered_applications_certificate_is_unauthenticated(broker):
    ghost = broker.as_("application:ghost")
    for call in (
        ghost.ListDevices(pb.ListDevicesRequest()),
        ghost.Reserve(pb.ReserveRequest()),
        collect(ghost.WatchReservations(pb.WatchReservationsRequest()), set()),
    ):
        r = await fails(call, C.UNAUTHENTICATED)
        assert r.reason == "UNKNOWN_APPLICATION"


@pytest.mark.parametrize("who", ["tenant:acme", "node:n-1", "service:cell_scheduler"])
async def test_tenant_node_and_service_certificates_are_refused(broker, who):
    await broker.device("gpu-1", 8)
    stub = broker.as_(who)
    for method, request_ in [*EVERY_CALL, ("PlanGraph", pb.PlanGraphRequest())]:
        r = await fails(getattr(stub, method)(request_), C.PERMISSION_DENIED)
        assert r.reason == "ROLE_REQUIRED", method
        assert r.message.startswith(f"{who} may not call {method}: it needs the role ")
    r = await fails(
        collect(stub.WatchReservations(pb.WatchReservationsRequest()), set()), C.PERMISSION_DENIED
    )
    assert r.reason == "ROLE_REQUIRED"
    # GetInfo is public
    assert (await stub.GetInfo(common_pb2.GetInfoRequest())).service == "lightpath.v1.CoreBroker"
    # nothing was done on their behalf
    assert await broker.free_now() == {"gpu-1": 8}
    # an application's token sent over such a certificate is that application
    app = await broker.app("cam")
    r = await stub.Reserve(
        pb.ReserveRequest(
            request=pb.ReservationRequest(reservation_id="r", cores=2, duration=dur(5))
        ),
        metadata=app,
    )
    assert r.application_id == "cam"


async def test_credentials_are_stored_hashed_and_rotation_revokes_the_old_one(broker, redis_client):
    resp = await broker.stub.RegisterApplication(
        pb.RegisterApplicationRequest(application_id="cam"), metadata=OP
    )
    app_id, secret = resp.token.split(":", 1)
    assert app_id == "cam" and not resp.rotated
    stored = await redis_client.hgetall(tenant_key("cam", "app"))
    assert stored["qos"] == "STANDARD" and stored["billing"] == "ON_DEMAND"
    assert all(secret not in v for v in stored.values())
    await broker.device("gpu-1", 8)
    assert len(await broker.free_now(bearer(resp.token))) == 1
    again = await broker.stub.RegisterApplication(
        pb.RegisterApplicationRequest(application_id="cam"), metadata=OP
    )
    assert again.rotated and again.token != resp.token
    await fails(broker.free_now(bearer(resp.token)), C.UNAUTHENTICATED)
    assert len(await broker.free_now(bearer(again.token))) == 1
    await broker.stub.RemoveApplication(
        pb.RemoveApplicationRequest(application_id="cam"), metadata=OP
    )
    await fails(broker.free_now(bearer(again.token)), C.UNAUTHENTICATED)
    await fails(
        broker.stub.RemoveApplication(
            pb.RemoveApplicationRequest(application_id="cam"), metadata=OP
        ),
        C.NOT_FOUND,
    )


async def test_an_application_cannot_touch_another_applications_reservation(broker):
    await broker.device("gpu-1", 16)
    a, b = await broker.app("a"), await broker.app("b")
    await broker.reserve(a, "r-a", 4, 30)
    s = broker.stub

    def touching(rid: str) -> list:
        return [
            s.GetReservation(pb.GetReservationRequest(reservation_id=rid), metadata=b),
            s.ReleaseReservation(pb.ReleaseReservationRequest(reservation_id=rid), metadata=b),
            s.ExtendReservation(
                pb.ExtendReservationRequest(reservation_id=rid, new_end=ts(now_ms() + 60_000)),
                metadata=b,
            ),
            collect(
                s.WatchReservations(pb.WatchReservationsRequest(reservation_id=rid), metadata=b),
                set(),
            ),
        ]

    # another application's reservation is not there for b: the same answer as one that
    # does not exist, so no call tells b what exists (issue 30)
    for call, none in zip(touching("r-a"), touching("r-none"), strict=True):
        theirs = await fails(call, C.NOT_FOUND)
        missing = await fails(none, C.NOT_FOUND)
        assert theirs.message.replace("r-a", "X") == missing.message.replace("r-none", "X")
    await fails(
        s.ListReservations(pb.ListReservationsRequest(application_id="a"), metadata=b),
        C.PERMISSION_DENIED,
    )
    taken = await fails(broker.reserve(b, "r-a", 4, 30), C.PERMISSION_DENIED)  # a's id
    assert taken.reason == "ID_UNAVAILABLE" and "application" not in taken.message
    # b sees nothing of a's; the operator sees everything
    mine = await s.ListReservations(pb.ListReservationsRequest(), metadata=b)
    assert list(mine.reservations) == []
    every = await s.ListReservations(pb.ListReservationsRequest(), metadata=OP)
    assert [r.reservation_id for r in every.reservations] == ["r-a"]
    got = await s.GetReservation(pb.GetReservationRequest(reservation_id="r-a"), metadata=OP)
    assert got.application_id == "a"


async def test_a_request_may_not_claim_a_qos_above_its_agreement(broker):
    await broker.device("gpu-1", 16)
    std = await broker.app("std", qos=pb.QOS_LEVEL_STANDARD)
    r = await fails(
        broker.reserve(std, "r", 1, 1, qos_level=pb.QOS_LEVEL_PREMIUM), C.PERMISSION_DENIED
    )
    assert r.reason == "QOS_ABOVE_AGREEMENT"
    low = await broker.reserve(std, "r", 1, 1, qos_level=pb.QOS_LEVEL_BEST_EFFORT)
    assert low.outcome == pb.OUTCOME_GRANTED


# -- devices and capacity (CB-1, CB-8) -------------------------------------------------


async def test_device_registry_rejects_bad_devices_naming_the_field(broker):
    s = broker.stub
    await fails(
        s.RegisterDevice(
            pb.RegisterDeviceRequest(device=pb.Device(device_id="bad id", cores=0)), metadata=OP
        ),
        C.INVALID_ARGUMENT,
        ["device.device_id", "device.kind", "device.cores"],
    )
    await fails(
        s.RegisterDevice(
            pb.RegisterDeviceRequest(device=pb.Device(device_id="d", kind=77, cores=4)),
            metadata=OP,
        ),
        C.INVALID_ARGUMENT,
        ["device.kind"],
    )
    await fails(s.RemoveDevice(pb.RemoveDeviceRequest(device_id="ghost"), metadata=OP), C.NOT_FOUND)


async def test_devices_list_with_reserved_and_free_cores_and_filter_by_kind(broker):
    await broker.device("gpu-1", 16, location=pb.Location(site="edge-a", x_km=1, y_km=2))
    await broker.device("tpu-1", 8, kind=pb.DEVICE_KIND_TPU, task_affinities=["nlp"])
    app = await broker.app("a")
    await broker.reserve(app, "r", 10, 30, device_kind=pb.DEVICE_KIND_GPU)
    resp = await broker.stub.ListDevices(pb.ListDevicesRequest(), metadata=app)
    by_id = {d.device.device_id: d for d in resp.devices}
    assert (by_id["gpu-1"].reserved_cores, by_id["gpu-1"].free_cores) == (10, 6)
    assert (by_id["tpu-1"].reserved_cores, by_id["tpu-1"].free_cores) == (0, 8)
    assert by_id["gpu-1"].device.location.site == "edge-a"
    assert list(by_id["tpu-1"].device.task_affinities) == ["nlp"]
    tpus = await broker.stub.ListDevices(
        pb.ListDevicesRequest(kind=pb.DEVICE_KIND_TPU), metadata=app
    )
    assert [d.device.device_id for d in tpus.devices] == ["tpu-1"]


async def test_lowering_cores_below_what_is_reserved_and_removing_a_busy_device_fail(broker):
    await broker.device("gpu-1", 16)
    app = await broker.app("a")
    await broker.reserve(app, "r", 10, 30)
    r = await fails(broker.device("gpu-1", 8), C.FAILED_PRECONDITION)
    assert r.reason == "DEVICE_CORES_IN_USE"
    await broker.device("gpu-1", 12)  # still >= 10: fine
    r = await fails(
        broker.stub.RemoveDevice(pb.RemoveDeviceRequest(device_id="gpu-1"), metadata=OP),
        C.FAILED_PRECONDITION,
    )
    assert r.reason == "DEVICE_IN_USE"
    await broker.stub.ReleaseReservation(
        pb.ReleaseReservationRequest(reservation_id="r"), metadata=app
    )
    await broker.stub.RemoveDevice(pb.RemoveDeviceRequest(device_id="gpu-1"), metadata=OP)
    assert await broker.free_now(app) == {}


async def test_capacity_over_a_time_range_per_device_and_per_kind(broker):
    await broker.device("g1", 16)
    await broker.device("g2", 16)
    await broker.device("t1", 8, kind=pb.DEVICE_KIND_TPU)
    a, b = await broker.app("a"), await broker.app("b")
    t0 = now_ms() + 60_000
    window = common_pb2.TimeWindow(earliest_start=ts(t0))
    await broker.reserve(a, "ra", 10, 10, window=window, device_ids=["g1"])
    await broker.reserve(b, "rb", 4, 10, window=window, device_ids=["g1"])
    q = pb.QueryCapacityRequest(start=ts(t0 - 5000), end=ts(t0 + 5000), include_schedule=True)
    resp = await broker.stub.QueryCapacity(q, metadata=a)
    by_id = {d.device.device_id: d for d in resp.devices}
    assert (by_id["g1"].free_cores, by_id["g1"].peak_reserved_cores) == (2, 14)
    assert by_id["g2"].free_cores == 16
    sched = {(s.cores, s.reservation_id) for s in by_id["g1"].schedule}
    assert sched == {(10, "ra"), (4, "")}  # b's id is not a's to see
    kinds = {k.kind: (k.devices, k.total_cores, k.free_cores) for k in resp.kinds}
    assert kinds == {pb.DEVICE_KIND_GPU: (2, 32, 18), pb.DEVICE_KIND_TPU: (1, 8, 8)}
    op = await broker.stub.QueryCapacity(q, metadata=OP)
    assert {s.reservation_id for d in op.devices for s in d.schedule} == {"ra", "rb"}
    before = await broker.stub.QueryCapacity(
        pb.QueryCapacityRequest(start=ts(t0 - 5000), end=ts(t0), device_ids=["g1"]),
        metadata=a,
    )
    assert [d.free_cores for d in before.devices] == [16]
    await fails(
        broker.stub.QueryCapacity(pb.QueryCapacityRequest(start=ts(t0), end=ts(t0)), metadata=a),
        C.INVALID_ARGUMENT,
        ["end"],
    )
    await fails(
        broker.stub.QueryCapacity(pb.QueryCapacityRequest(device_ids=["nope"]), metadata=a),
        C.NOT_FOUND,
    )
    await fails(
        broker.stub.QueryCapacity(pb.QueryCapacityRequest(kind=42), metadata=a),
        C.INVALID_ARGUMENT,
        ["kind"],
    )


async def test_the_latency_table_drives_lowest_latency_placement(broker):
    for d in ("d1", "d2", "d3"):
        await broker.device(d, 8)
    set_ = broker.stub.SetLatencies
    resp = await set_(
        pb.SetLatenciesRequest(
            latencies=[
                pb.Latency(site="edge-1", device_id="d1", latency_ms=9),
                pb.Latency(site="edge-1", device_id="d2", latency_ms=1.5),
                pb.Latency(site="edge-1", device_id="d3", latency_ms=4),
            ]
        ),
        metadata=OP,
    )
    assert resp.entries == 3
    app = await broker.app("a")
    loc = pb.Location(site="edge-1")
    policy = pb.PLACEMENT_POLICY_LOWEST_LATENCY
    r = await broker.reserve(app, "r1", 4, 30, placement=policy, client_location=loc)
    assert [a.device_id for a in r.allocations] == ["d2"]
    await set_(
        pb.SetLatenciesRequest(
            latencies=[pb.Latency(site="edge-1", device_id="d2", latency_ms=-1)]
        ),
        metadata=OP,
    )
    r = await broker.reserve(app, "r2", 4, 30, placement=policy, client_location=loc)
    assert [a.device_id for a in r.allocations] == ["d3"]
    await fails(
        set_(
            pb.SetLatenciesRequest(latencies=[pb.Latency(site="edge-1", device_id="zz")]),
            metadata=OP,
        ),
        C.NOT_FOUND,
    )
    await fails(set_(pb.SetLatenciesRequest(), metadata=OP), C.INVALID_ARGUMENT, ["latencies"])


# -- decisions (CB-3 … CB-5) -------------------------------------------------------------


async def test_fig2_three_applications_get_25_21_and_10_cores(broker):
    await broker.device("gpu-104", 64)
    t0 = now_ms() + 10_000
    got = []
    for app_id, cores, offset, seconds in (("c1", 25, 0, 10), ("c2", 21, 2, 10), ("cn", 10, 5, 4)):
        md = await broker.app(app_id)
        window = common_pb2.TimeWindow(earliest_start=ts(t0 + offset * 1000))
        got.append(await broker.reserve(md, f"req-{app_id}", cores, seconds, window=window))
    assert [r.outcome for r in got] == [pb.OUTCOME_GRANTED] * 3
    assert [[(a.device_id, a.cores) for a in r.allocations] for r in got] == [
        [("gpu-104", 25)],
        [("gpu-104", 21)],
        [("gpu-104", 10)],
    ]
    assert [r.start.ToMilliseconds() - t0 for r in got] == [0, 2000, 5000]
    assert [r.end.ToMilliseconds() - t0 for r in got] == [10_000, 12_000, 9000]
    assert all(r.state == pb.RESERVATION_STATE_SCHEDULED for r in got)
    assert got[0].priority.level in (
        common_pb2.PRIORITY_CLASS_LOW,
        common_pb2.PRIORITY_CLASS_MEDIUM,
        common_pb2.PRIORITY_CLASS_HIGH,
    )
    assert 0.0 <= got[0].priority.score <= 1.0


def _fig3_requests(lower_accepts):
    higher = pb.ReservationRequest(
        reservation_id="req-302-1",
        cores=50,
        duration=dur(20),
        task_type="computer-vision",
        qos_level=pb.QOS_LEVEL_PREMIUM,
        billing_model=pb.BILLING_MODEL_COMMITTED,
        priority_hint=90,
    )
    lower = pb.ReservationRequest(
        reservation_id="req-302-n",
        cores=50,
        duration=dur(20),
        task_type="training",
        qos_level=pb.QOS_LEVEL_BEST_EFFORT,
        billing_model=pb.BILLING_MODEL_SPOT,
        priority_hint=10,
        accept=[lower_accepts],
    )
    return higher, lower


@pytest.mark.parametrize(
    "lower_accepts", [pb.OUTCOME_PARTIAL, pb.OUTCOME_DEFERRED], ids=["fig3", "fig4"]
)
async def test_fig3_fig4_a_batch_serves_the_higher_priority_first(broker, lower_accepts):
    await broker.device("gpu-1", 80)
    app = await broker.app("edge-gateway")
    higher, lower = _fig3_requests(lower_accepts)
    resp = await broker.stub.BatchReserve(
        pb.BatchReserveRequest(requests=[lower, higher]), metadata=app
    )
    low, high = resp.reservations
    assert high.outcome == pb.OUTCOME_GRANTED and high.cores_at_start == 50
    assert high.priority.score > low.priority.score
    assert high.priority.level == common_pb2.PRIORITY_CLASS_HIGH
    assert low.priority.level == common_pb2.PRIORITY_CLASS_LOW
    high_end = high.end.ToMilliseconds()
    if lower_accepts == pb.OUTCOME_PARTIAL:
        assert low.outcome == pb.OUTCOME_PARTIAL
        assert low.cores_at_start == 30
        later = [a for a in low.allocations if a.start.ToMilliseconds() == high_end]
        assert sum(a.cores for a in later) == 20
        assert low.summary.startswith("30 cores now, 20 more in 20 s")
    else:
        assert low.outcome == pb.OUTCOME_DEFERRED
        assert low.start.ToMilliseconds() == high_end
        assert low.cores_at_start == 50


async def test_requests_of_different_applications_in_one_window_are_decided_by_priority(
    redis_url,
):
    # a wide window so that two concurrent calls surely share one batch (CB-5)
    async with running_broker(redis_url, LIGHTPATH_CB_BATCH_WINDOW_MS="300") as b:
        await b.device("gpu-1", 80)
        cam, trainer = await b.app("camera"), await b.app("trainer")
        higher, lower = _fig3_requests(pb.OUTCOME_PARTIAL)
        low, high = await asyncio.gather(
            b.stub.Reserve(pb.ReserveRequest(request=lower), metadata=trainer),
            b.stub.Reserve(pb.ReserveRequest(request=higher), metadata=cam),
        )
        assert high.outcome == pb.OUTCOME_GRANTED
        assert (low.outcome, low.cores_at_start) == (pb.OUTCOME_PARTIAL, 30)


async def test_rejected_says_when_it_could_be_met_and_stores_nothing(broker):
    await broker.device("gpu-1", 16)
    app = await broker.app("a")
    first = await broker.reserve(app, "big", 12, 30)
    r = await broker.reserve(app, "r", 8, 10, accept=[pb.OUTCOME_GRANTED])
    assert r.outcome == pb.OUTCOME_REJECTED and r.state == pb.RESERVATION_STATE_REJECTED
    assert list(r.allocations) == []
    assert r.earliest_possible_start.ToMilliseconds() == first.end.ToMilliseconds()
    await fails(
        broker.stub.GetReservation(pb.GetReservationRequest(reservation_id="r"), metadata=app),
        C.NOT_FOUND,
    )


@pytest.mark.parametrize(
    ("fields", "violations"),
    [
        ({"cores": 0}, ["request.cores"]),
        ({"duration": dur(-5)}, ["request.duration"]),
        ({"duration": dur(0)}, ["request.duration"]),
        (
            {"window": common_pb2.TimeWindow(latest_end=ts(now_ms() + 3000))},
            ["request.window"],
        ),
        ({"device_kind": 99}, ["request.device_kind"]),
        ({"cores": 41}, ["request.cores"]),  # more than exist anywhere
        ({"cores": 9, "device_kind": pb.DEVICE_KIND_TPU}, ["request.cores"]),
        ({"reservation_id": "no:colons"}, ["request.reservation_id"]),
        ({"accept": [pb.OUTCOME_REJECTED]}, ["request.accept[0]"]),
        ({"placement": pb.PLACEMENT_POLICY_NEAREST}, ["request.client_location"]),
        ({"priority_hint": 150}, ["request.priority_hint"]),
    ],
)
async def test_bad_requests_are_invalid_argument_naming_the_field(broker, fields, violations):
    await broker.device("g1", 16)
    await broker.device("g2", 16)
    await broker.device("t1", 8, kind=pb.DEVICE_KIND_TPU)
    app = await broker.app("a")
    args = {"reservation_id": "r", "cores": 4, "duration": dur(10), **fields}
    await fails(
        broker.stub.Reserve(pb.ReserveRequest(request=pb.ReservationRequest(**args)), metadata=app),
        C.INVALID_ARGUMENT,
        violations,
    )
    assert await broker.free_now(app) == {"g1": 16, "g2": 16, "t1": 8}


async def test_an_unknown_device_id_in_a_request_is_not_found(broker):
    await broker.device("g1", 16)
    app = await broker.app("a")
    await fails(broker.reserve(app, "r", 1, 1, device_ids=["nope"]), C.NOT_FOUND)


async def test_a_retry_returns_the_stored_decision_and_a_changed_request_is_refused(broker):
    await broker.device("g1", 16)
    app = await broker.app("a")
    first = await broker.reserve(app, "r", 4, 30)
    again = await broker.reserve(app, "r", 4, 30)
    # the stored reservation as it is now (the sweep may have started it meanwhile)
    assert again.version >= first.version and again.outcome == first.outcome
    assert list(again.allocations) == list(first.allocations)
    assert await broker.free_now(app) == {"g1": 12}
    r = await fails(broker.reserve(app, "r", 5, 30), C.FAILED_PRECONDITION)
    assert r.reason == "RESERVATION_ID_REUSED"


async def test_batch_reserve_errors_and_all_or_nothing(broker):
    await broker.device("g1", 10)
    app = await broker.app("a")
    s = broker.stub

    def req(rid, cores):
        return pb.ReservationRequest(reservation_id=rid, cores=cores, duration=dur(30))

    await fails(s.BatchReserve(pb.BatchReserveRequest(), metadata=app), C.INVALID_ARGUMENT)
    await fails(
        s.BatchReserve(pb.BatchReserveRequest(requests=[req("x", 1), req("x", 2)]), metadata=app),
        C.INVALID_ARGUMENT,
        ["requests[1].reservation_id"],
    )
    await fails(
        s.BatchReserve(pb.BatchReserveRequest(requests=[req("x", 1), req("y", 0)]), metadata=app),
        C.INVALID_ARGUMENT,
        ["requests[1].cores"],
    )
    none = await s.BatchReserve(
        pb.BatchReserveRequest(requests=[req("p1", 6), req("p2", 6)], all_or_nothing=True),
        metadata=app,
    )
    assert [r.outcome for r in none.reservations] == [pb.OUTCOME_REJECTED] * 2
    assert await broker.free_now(app) == {"g1": 10}
    both = await s.BatchReserve(
        pb.BatchReserveRequest(requests=[req("p1", 6), req("p2", 4)], all_or_nothing=True),
        metadata=app,
    )
    assert [r.outcome for r in both.reservations] == [pb.OUTCOME_GRANTED] * 2
    assert await broker.free_now(app) == {"g1": 0}


# -- release, extend, list (CB-6) -----------------------------------------------------------


async def test_early_release_returns_the_cores_at_once_and_is_idempotent(broker):
    await broker.device("g1", 16)
    app = await broker.app("a")
    later = common_pb2.TimeWindow(earliest_start=ts(now_ms() + 60_000))
    await broker.reserve(app, "now", 6, 60)
    await broker.reserve(app, "later", 10, 60, window=later)
    rel = pb.ReleaseReservationRequest
    released = await broker.stub.ReleaseReservation(rel(reservation_id="now"), metadata=app)
    assert released.state == pb.RESERVATION_STATE_RELEASED
    assert released.end.ToMilliseconds() <= now_ms()  # held until the release, no longer
    assert await broker.free_now(app) == {"g1": 16}
    future = await broker.stub.ReleaseReservation(rel(reservation_id="later"), metadata=app)
    assert list(future.allocations) == []  # never started: nothing was held
    again = await broker.stub.ReleaseReservation(rel(reservation_id="now"), metadata=app)
    assert again.version == released.version
    await fails(
        broker.stub.ReleaseReservation(rel(reservation_id="ghost"), metadata=app), C.NOT_FOUND
    )
    await fails(
        broker.stub.ReleaseReservation(rel(reservation_id="bad id"), metadata=app),
        C.INVALID_ARGUMENT,
        ["reservation_id"],
    )


async def test_extension_when_free_and_resource_exhausted_when_not(broker):
    await broker.device("g1", 16)
    app = await broker.app("a")
    r = await broker.reserve(app, "r", 10, 10)
    end = r.end.ToMilliseconds()
    blocker_start = end + 5000
    await broker.reserve(
        app, "blocker", 10, 10, window=common_pb2.TimeWindow(earliest_start=ts(blocker_start))
    )
    ext = broker.stub.ExtendReservation
    longer = await ext(
        pb.ExtendReservationRequest(reservation_id="r", new_end=ts(end + 3000)), metadata=app
    )
    assert longer.end.ToMilliseconds() == end + 3000
    # the summary says the window as it is now (it was written at the decision)
    assert r.summary == "10 cores now for 10 s (on 1 device)"
    assert longer.summary == "10 cores now for 13 s (on 1 device)"
    assert longer.state in (pb.RESERVATION_STATE_SCHEDULED, pb.RESERVATION_STATE_ACTIVE)
    same = await ext(
        pb.ExtendReservationRequest(reservation_id="r", new_end=ts(end + 3000)), metadata=app
    )
    assert same.version == longer.version  # idempotent
    r2 = await fails(
        ext(pb.ExtendReservationRequest(reservation_id="r", new_end=ts(end + 9000)), metadata=app),
        C.RESOURCE_EXHAUSTED,
    )
    assert r2.reason == "CORES_TAKEN"
    got = await broker.stub.GetReservation(
        pb.GetReservationRequest(reservation_id="r"), metadata=app
    )
    assert got.end.ToMilliseconds() == end + 3000  # nothing changed
    await fails(
        ext(pb.ExtendReservationRequest(reservation_id="r", new_end=ts(end)), metadata=app),
        C.INVALID_ARGUMENT,
        ["new_end"],
    )
    await fails(
        ext(pb.ExtendReservationRequest(reservation_id="r"), metadata=app), C.INVALID_ARGUMENT
    )
    await broker.stub.ReleaseReservation(
        pb.ReleaseReservationRequest(reservation_id="r"), metadata=app
    )
    await fails(
        ext(pb.ExtendReservationRequest(reservation_id="r", new_end=ts(end + 4000)), metadata=app),
        C.FAILED_PRECONDITION,
    )


async def test_list_pages_newest_first(broker):
    await broker.device("g1", 64)
    app = await broker.app("a")
    for i in range(5):
        await broker.reserve(app, f"r{i}", 1, 30)
    seen = []
    token = ""
    while True:
        page = await broker.stub.ListReservations(
            pb.ListReservationsRequest(page_size=2, page_token=token), metadata=app
        )
        seen += [r.reservation_id for r in page.reservations]
        token = page.next_page_token
        if not token:
            break
    assert seen == ["r4", "r3", "r2", "r1", "r0"]
    await fails(
        broker.stub.ListReservations(pb.ListReservationsRequest(page_token="x"), metadata=app),
        C.INVALID_ARGUMENT,
        ["page_token"],
    )


# -- expiry and the watch stream (CB-6) --------------------------------------------------------


async def test_expiry_returns_the_cores_and_the_watch_says_started_and_ended(broker):
    await broker.device("g1", 16)
    app = await broker.app("a")
    r = await broker.reserve(app, "short", 8, 0.4)
    events = await collect(
        broker.stub.WatchReservations(
            pb.WatchReservationsRequest(reservation_id="short"), metadata=app
        ),
        {pb.RESERVATION_EVENT_TYPE_ENDED},
    )
    kinds = [e.type for e in events]
    assert kinds[0] == pb.RESERVATION_EVENT_TYPE_CURRENT
    assert kinds[-1] == pb.RESERVATION_EVENT_TYPE_ENDED
    if events[0].reservation.state == pb.RESERVATION_STATE_SCHEDULED:
        assert pb.RESERVATION_EVENT_TYPE_STARTED in kinds
    assert events[-1].reservation.state == pb.RESERVATION_STATE_ENDED
    assert events[-1].at.ToMilliseconds() >= r.end.ToMilliseconds()
    assert await broker.free_now(app) == {"g1": 16}
    got = await broker.stub.GetReservation(
        pb.GetReservationRequest(reservation_id="short"), metadata=app
    )
    assert got.state == pb.RESERVATION_STATE_ENDED
    await fails(
        broker.stub.ReleaseReservation(
            pb.ReleaseReservationRequest(reservation_id="short"), metadata=app
        ),
        C.FAILED_PRECONDITION,
    )


async def test_an_application_watch_sees_a_partial_grant_start_change_and_end(broker):
    await broker.device("g1", 10)
    app = await broker.app("a")
    stream = broker.stub.WatchReservations(pb.WatchReservationsRequest(), metadata=app)
    await broker.reserve(app, "first", 6, 0.4)
    await broker.reserve(app, "second", 8, 0.4, accept=[pb.OUTCOME_PARTIAL])
    seen: dict[str, list[int]] = {}
    async for ev in stream:
        seen.setdefault(ev.reservation.reservation_id, []).append(ev.type)
        if seen.get("second", [])[-1:] == [pb.RESERVATION_EVENT_TYPE_ENDED]:
            break
    T = pb.ReservationEventType
    assert seen["second"] == [
        T.Value("RESERVATION_EVENT_TYPE_CREATED"),
        T.Value("RESERVATION_EVENT_TYPE_STARTED"),  # 4 cores now
        T.Value("RESERVATION_EVENT_TYPE_PART_STARTED"),  # the other 4 when "first" ends
        T.Value("RESERVATION_EVENT_TYPE_PART_ENDED"),
        T.Value("RESERVATION_EVENT_TYPE_ENDED"),
    ]
    stream.cancel()


async def test_watching_an_ended_reservation_says_so_and_ends(broker):
    await broker.device("g1", 10)
    app = await broker.app("a")
    await broker.reserve(app, "r", 1, 1)
    await broker.stub.ReleaseReservation(
        pb.ReleaseReservationRequest(reservation_id="r"), metadata=app
    )
    events = [
        e
        async for e in broker.stub.WatchReservations(
            pb.WatchReservationsRequest(reservation_id="r"), metadata=app
        )
    ]
    assert [e.type for e in events] == [pb.RESERVATION_EVENT_TYPE_CURRENT]
    assert events[0].reservation.state == pb.RESERVATION_STATE_RELEASED
    await fails(
        collect(
            broker.stub.WatchReservations(
                pb.WatchReservationsRequest(reservation_id="ghost"), metadata=app
            ),
            set(),
        ),
        C.NOT_FOUND,
    )


async def test_a_redis_that_lost_its_state_is_followed_not_trusted(broker, redis_client):
    await broker.device("g1", 16)
    app = await broker.app("a")
    await broker.reserve(app, "r", 10, 60)
    await redis_client.flushall()  # Redis restarted empty
    app = await broker.app("a")  # its credential went with it
    # so did the devices: the commit finds none, the broker reloads, and then says so
    await fails(broker.reserve(app, "r2", 1, 60), C.INVALID_ARGUMENT, ["request.cores"])
    await broker.device("g2", 8)
    assert await broker.free_now(app) == {"g2": 8}  # nothing of the old state survives
    r = await broker.reserve(app, "r", 8, 60)
    assert r.outcome == pb.OUTCOME_GRANTED and [a.device_id for a in r.allocations] == ["g2"]


async def test_operator_calls_reject_bad_input_naming_the_field(broker):
    s = broker.stub
    await fails(
        s.RegisterApplication(
            pb.RegisterApplicationRequest(application_id="a", qos_level=9, billing_model=7),
            metadata=OP,
        ),
        C.INVALID_ARGUMENT,
        ["qos_level", "billing_model"],
    )
    await fails(
        s.RegisterApplication(pb.RegisterApplicationRequest(application_id="a b"), metadata=OP),
        C.INVALID_ARGUMENT,
        ["application_id"],
    )
    await broker.device("g1", 4)
    await fails(
        s.SetLatencies(
            pb.SetLatenciesRequest(
                latencies=[pb.Latency(site="", device_id="g1", latency_ms=float("nan"))]
            ),
            metadata=OP,
        ),
        C.INVALID_ARGUMENT,
        ["latencies[0].site", "latencies[0].latency_ms"],
    )
