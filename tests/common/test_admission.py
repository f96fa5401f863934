"""Admission control (issue 14): the limiter alone, then over real gRPC through the
one server factory: a saturated service queues what it can, refuses the rest with
RESOURCE_EXHAUSTED and a retry delay (never INTERNAL), and keeps answering health,
GetInfo and other Lightpath services."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import channel, error_report
from lightpath.security.identity import OPERATOR, TENANT, Principal, service_principal
from lightpath.v1 import common_pb2
from lightpath_services.common.admission import (
    OVERLOADED,
    POD_BUSY,
    Admission,
    exempt_principal,
    sheddable,
)
from lightpath_services.common.errors import ResourceExhausted
from lightpath_services.common.policy import RULES, read, write
from lightpath_services.common.server import ServiceDefinition, create_server, running
from lightpath_services.common.settings import CommonSettings, SettingsError, load
from tests.helpers import credentials, tls_env

# -- the limiter ---------------------------------------------------------------


async def test_calls_within_the_limit_start_at_once_and_the_next_waits_its_turn():
    limiter = Admission(2, 2, 5.0)
    await limiter.acquire()
    await limiter.acquire()
    assert limiter.inflight == 2 and limiter.queued == 0

    third = asyncio.create_task(limiter.acquire())
    fourth = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    assert not third.done() and not fourth.done() and limiter.queued == 2

    limiter.release()  # goes to the oldest waiter, not back to the pool
    await asyncio.sleep(0)
    assert third.done() and not fourth.done()
    assert limiter.inflight == 2 and limiter.queued == 1

    limiter.release()
    await fourth
    for _ in range(2):
        limiter.release()
    assert limiter.inflight == 0 and limiter.queued == 0


async def test_a_full_queue_refuses_at_once_with_a_retry_delay():
    limiter = Admission(1, 1, 5.0, service="cell_scheduler")
    await limiter.acquire()
    waiting = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ResourceExhausted) as refused:
        await limiter.acquire()
    assert loop.time() - started < 0.05
    err = refused.value
    assert err.code == "RESOURCE_EXHAUSTED" and err.reason == OVERLOADED
    assert 5.0 <= err.retry_delay_s <= 10.0  # half the recent calls refused: longer, capped
    assert "cell_scheduler is overloaded" in err.message
    assert f"retry in {err.retry_delay_s:g} s" in err.message
    assert "queue is full" in err.message
    assert limiter.shed == 1

    limiter.release()
    await waiting
    limiter.release()
    assert limiter.inflight == 0


async def test_a_call_queued_longer_than_the_wait_is_refused_and_leaves_the_queue():
    limiter = Admission(1, 4, 0.1)
    await limiter.acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ResourceExhausted) as refused:
        await limiter.acquire()
    assert 0.09 <= loop.time() - started < 1.0
    assert "no call finished within 0.1 s" in refused.value.message
    assert refused.value.retry_delay_s >= 0.1
    assert limiter.queued == 0 and limiter.inflight == 1
    limiter.release()
    assert limiter.inflight == 0


async def test_no_queue_sheds_instead_of_waiting():
    for limiter in (Admission(1, 0, 1.0), Admission(1, 5, 0.0)):
        await limiter.acquire()
        with pytest.raises(ResourceExhausted):
            await limiter.acquire()
        limiter.release()
        assert limiter.inflight == 0


async def test_a_waiter_cancelled_in_the_queue_takes_nothing_with_it():
    limiter = Admission(1, 2, 5.0)
    await limiter.acquire()
    gone = asyncio.create_task(limiter.acquire())
    stays = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0)
    assert limiter.queued == 1  # the cancelled one left the queue

    limiter.release()  # to `stays`, not to the cancelled one
    await stays
    assert limiter.inflight == 1
    limiter.release()
    assert limiter.inflight == 0 and limiter.queued == 0


async def test_a_waiter_cancelled_just_after_its_slot_came_gives_the_slot_back():
    limiter = Admission(1, 2, 5.0)
    await limiter.acquire()
    unlucky = asyncio.create_task(limiter.acquire())
    next_one = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0.01)
    limiter.release()  # the slot passes to `unlucky`...
    unlucky.cancel()  # ...which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    await asyncio.wait_for(next_one, 1.0)  # so the slot went on, not lost
    assert limiter.inflight == 1
    limiter.release()
    assert limiter.inflight == 0


async def test_what_is_refused_at_once_is_known_before_the_call_costs_anything():
    limiter = Admission(1, 1, 5.0, service="svc", freeing_slots=1)
    freeing = limiter.freeing
    assert freeing is not None
    assert not limiter.would_refuse() and limiter.refusal_now() is None  # a slot is free
    await limiter.acquire()
    assert not limiter.would_refuse()  # it may wait: the queue has a place
    queued = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.would_refuse() and not freeing.would_refuse()  # the freeing lane has its own
    shed = limiter.shed
    refusal = limiter.refusal_now()
    assert refusal is not None and refusal.reason == OVERLOADED and refusal.retry_delay_s
    assert limiter.shed == shed + 1  # counted as acquire counts one
    with pytest.raises(ResourceExhausted):
        await limiter.acquire()  # the same answer
    await freeing.acquire()
    assert not freeing.would_refuse()  # its own queue has a place
    waiting = asyncio.create_task(freeing.acquire())
    await asyncio.sleep(0)
    assert freeing.would_refuse()
    refusal = freeing.refusal_now()
    assert refusal is not None and "calls that end or release work" in refusal.message
    freeing.release()
    await waiting
    freeing.release()
    limiter.release()
    await queued
    limiter.release()
    assert limiter.refusal_now() is None and (limiter.inflight, freeing.inflight) == (0, 0)


def test_what_is_never_shed():
    assert sheddable("/lightpath.v1.CellScheduler/SubmitJob", streaming=False)
    assert sheddable("/lightpath.v1.WorkloadScheduler/AdmitJob", streaming=False)
    assert sheddable("/lightpath.v1.CoreBroker/Reserve", streaming=False)
    for method in (
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/lightpath.v1.CellScheduler/GetInfo",
        "/lightpath.v1.CellScheduler/ReportPodStatus",
        "/lightpath.v1.CellScheduler/RegisterPod",
        "/lightpath.v1.AggSwitch/ReportLoad",
        "/lightpath.v1.AggSwitch/JoinCommand",
    ):
        assert not sheddable(method, streaming=False), method
    assert not sheddable("/lightpath.v1.CellScheduler/WatchJob", streaming=True)
    assert not sheddable("/lightpath.v1.AggSwitch/Contribute", streaming=True)

    assert exempt_principal(service_principal("cell_scheduler"))
    assert exempt_principal(service_principal("workload_scheduler", "pod-1"))
    assert not exempt_principal(Principal("tenant", "acme"))
    assert not exempt_principal(Principal("operator", "operator"))
    assert not exempt_principal(None)


def test_settings_defaults_and_bad_values():
    s = load(CommonSettings, {})
    assert (s.max_inflight, s.max_queued, s.queue_wait_s, s.target_latency_s) == (64, 128, 0.5, 0.5)
    assert s.queue_target_s == 0.1
    for env, raw in (
        ("LIGHTPATH_MAX_INFLIGHT", "0"),
        ("LIGHTPATH_MAX_QUEUED", "-1"),
        ("LIGHTPATH_QUEUE_WAIT_S", "-0.5"),
        ("LIGHTPATH_QUEUE_TARGET_S", "-0.1"),
        ("LIGHTPATH_TARGET_LATENCY_S", "-1"),
    ):
        with pytest.raises(SettingsError, match=env):
            load(CommonSettings, {env: raw})


# -- over real gRPC ------------------------------------------------------------

PROBE = "lightpath.test.Busy"


class Probe:
    """Handlers that hold until the test lets them go."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = 0
        self.finished = 0

    async def hold(self, request, context):
        self.started += 1
        await self.go.wait()
        self.finished += 1
        return common_pb2.ServiceInfo(service="held")

    async def boom(self, request, context):
        raise RuntimeError("a bug")

    async def busy(self, request, context):
        raise ResourceExhausted("the pod is busy", reason=POD_BUSY, retry_delay_s=0.3)

    async def get_info(self, request, context):
        return common_pb2.ServiceInfo(service=PROBE)

    def definition(self) -> ServiceDefinition:
        def unary(fn):
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=common_pb2.GetInfoRequest.FromString,
                response_serializer=common_pb2.ServiceInfo.SerializeToString,
            )

        generic = grpc.method_handlers_generic_handler(
            PROBE,
            {
                "Hold": unary(self.hold),
                "Boom": unary(self.boom),
                "Busy": unary(self.busy),
                "GetInfo": unary(self.get_info),
                # named as a call that ends work: the freeing lane (issue 30)
                "CompleteJob": unary(self.hold),
                "Submit": unary(self.hold),  # audited (busy_rules)
            },
        )
        return ServiceDefinition(
            PROBE, None, lambda _servicer, server: server.add_generic_rpc_handlers((generic,))
        )


@pytest.fixture(autouse=True)
def busy_rules(monkeypatch):
    for name in ("Hold", "Boom", "Busy", "GetInfo", "CompleteJob"):
        monkeypatch.setitem(RULES, f"/{PROBE}/{name}", read("operator", "service:cell_scheduler"))
    monkeypatch.setitem(RULES, f"/{PROBE}/Submit", write("operator"))


def _settings(
    redis_url: str, inflight: int, queued: int, wait_s: float, **env: str
) -> CommonSettings:
    return load(
        CommonSettings,
        {
            **env,
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": "127.0.0.1:0",
            "LIGHTPATH_MAX_INFLIGHT": str(inflight),
            "LIGHTPATH_MAX_QUEUED": str(queued),
            "LIGHTPATH_QUEUE_WAIT_S": str(wait_s),
            # these tests hold calls queued for as long as they take: no standing-queue
            # bound (the limiter's own tests cover it, on an injected clock)
            "LIGHTPATH_QUEUE_TARGET_S": "0",
            **tls_env(service_principal("probe")),
        },
    )


def _call(ch: grpc.aio.Channel, method: str):
    return ch.unary_unary(
        f"/{PROBE}/{method}",
        request_serializer=common_pb2.GetInfoRequest.SerializeToString,
        response_deserializer=common_pb2.ServiceInfo.FromString,
    )


async def _until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def _outcome(call) -> common_pb2.ServiceInfo | grpc.aio.AioRpcError:
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        return err


async def test_a_saturated_service_queues_sheds_with_a_delay_and_still_answers_probes(redis_url):
    probe = Probe()

    async def build(runtime):
        return [probe.definition()]

    async with (
        running("probe", _settings(redis_url, 2, 2, 10.0), build) as svc,
        channel(svc.address) as ch,
        channel(svc.address, credentials=credentials(service_principal("cell_scheduler"))) as peer,
    ):
        hold = _call(ch, "Hold")
        calls = [asyncio.create_task(_outcome(hold(common_pb2.GetInfoRequest()))) for _ in range(8)]
        await _until(lambda: probe.started == 2 and sum(c.done() for c in calls) == 4)
        refused = [c.result() for c in calls if c.done()]
        for err in refused:
            assert isinstance(err, grpc.aio.AioRpcError)
            report = error_report(err)
            assert report.code == grpc.StatusCode.RESOURCE_EXHAUSTED, report
            assert report.reason == OVERLOADED
            assert report.retry_delay_s is not None and report.retry_delay_s >= 10.0
            assert "probe is overloaded" in report.message
            assert "retry in" in report.message and "queue is full" in report.message

        # Saturated (2 in progress, 2 queued): health, GetInfo and a peer service still get in.
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        info = await _call(ch, "GetInfo")(common_pb2.GetInfoRequest(), timeout=2)
        assert info.service == PROBE
        from_peer = asyncio.create_task(_outcome(_call(peer, "Hold")(common_pb2.GetInfoRequest())))
        await _until(lambda: probe.started == 3)  # started beside the two, not queued

        probe.go.set()
        outcomes = await asyncio.gather(*calls, from_peer)
        accepted = [o for o in outcomes if isinstance(o, common_pb2.ServiceInfo)]
        assert len(accepted) == 5 and all(o.service == "held" for o in accepted)
        assert sum(isinstance(o, grpc.aio.AioRpcError) for o in outcomes) == 4
        assert probe.finished == 5


async def test_a_call_queued_too_long_is_refused_and_errors_and_cancels_free_their_slot(
    redis_url,
):
    probe = Probe()

    async def build(runtime):
        return [probe.definition()]

    async with (
        running("probe", _settings(redis_url, 1, 1, 0.2), build) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        hold, boom = _call(ch, "Hold"), _call(ch, "Boom")
        first = asyncio.create_task(_outcome(hold(common_pb2.GetInfoRequest())))
        await _until(lambda: probe.started == 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        late = await _outcome(hold(common_pb2.GetInfoRequest()))
        assert 0.15 <= loop.time() - started < 2.0
        assert isinstance(late, grpc.aio.AioRpcError)
        report = error_report(late)
        assert report.code == grpc.StatusCode.RESOURCE_EXHAUSTED and report.retry_delay_s
        assert "no call finished within 0.2 s" in report.message

        # The caller of the held call gives up (deadline): its slot comes back.
        first.cancel()
        gone = asyncio.create_task(_outcome(hold(common_pb2.GetInfoRequest(), timeout=0.5)))
        await _until(lambda: probe.started == 2)  # admitted: the cancelled call's slot was freed
        gone = await gone
        assert isinstance(gone, grpc.aio.AioRpcError)
        assert gone.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        # A handler that fails frees its slot too: with one slot, call after call gets in.
        for _ in range(5):
            failed = await _outcome(boom(common_pb2.GetInfoRequest()))
            assert isinstance(failed, grpc.aio.AioRpcError)
            assert failed.code() == grpc.StatusCode.INTERNAL  # a bug in the handler, not shedding

        probe.go.set()
        done = await hold(common_pb2.GetInfoRequest(), timeout=2)
        assert done.service == "held"


async def test_a_shed_call_costs_no_span_and_is_counted_in_the_audit_log_not_written(
    redis_url, spans_factory, tmp_path
):
    """Issue 30: at 4x the load most calls are shed, and a span and an audit line each
    were CPU taken from the calls served. The caller is still authenticated and
    authorized first: a denied or anonymous one is answered and written as ever."""
    probe = Probe()
    spans = spans_factory("probe")
    audit = tmp_path / "audit.jsonl"

    async def build(runtime):
        return [probe.definition()]

    settings = _settings(redis_url, 1, 1, 1.0, LIGHTPATH_AUDIT_LOG=str(audit))
    async with (
        running("probe", settings, build, tracer_provider=spans.provider) as svc,
        channel(svc.address, max_attempts=1) as ch,
        channel(
            svc.address, credentials=credentials(Principal(TENANT, "acme")), max_attempts=1
        ) as tenant,
        channel(
            svc.address,
            credentials=credentials(Principal(OPERATOR, OPERATOR), token="lp_unknown"),
            max_attempts=1,
        ) as unknown_token,
    ):
        submit = _call(ch, "Submit")
        held = asyncio.create_task(_outcome(submit(common_pb2.GetInfoRequest())))
        await _until(lambda: probe.started == 1)
        # one waits in the queue (and is refused when its wait is up), three find it full
        refused = await asyncio.gather(
            *(_outcome(submit(common_pb2.GetInfoRequest())) for _ in range(4))
        )
        for err in refused:
            assert isinstance(err, grpc.aio.AioRpcError)
            report = error_report(err)
            assert report.code == grpc.StatusCode.RESOURCE_EXHAUSTED and report.reason == OVERLOADED
            assert report.retry_delay_s and "retry in" in report.message
        assert sum("no call finished within 1 s" in e.details() for e in refused) == 1
        # the door still asks who calls, and whether they may, first
        denied = await _outcome(_call(tenant, "Submit")(common_pb2.GetInfoRequest()))
        assert isinstance(denied, grpc.aio.AioRpcError)
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        anonymous = await _outcome(_call(unknown_token, "Submit")(common_pb2.GetInfoRequest()))
        assert isinstance(anonymous, grpc.aio.AioRpcError)
        assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED
        probe.go.set()
        assert (await held).service == "held"

    # spans: the served call, the one refused after its wait, the denied and the anonymous one
    submits = [s for s in spans.finished() if s.name == f"{PROBE}/Submit"]
    assert len(submits) == 4
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    # one line per call answered, but the shed ones: counts, one line per second at most
    assert sorted(e["code"] for e in entries if e["code"] != "RESOURCE_EXHAUSTED") == [
        "OK",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
    ]
    by_code = {e["code"]: e for e in entries}
    shed = [e for e in entries if e["code"] == "RESOURCE_EXHAUSTED"]
    assert 1 <= len(shed) <= 2 and sum(e["count"] for e in shed) == 4
    for e in shed:
        assert e["reason"] == OVERLOADED and "nothing was done" in e["message"]
        assert e["principal"] == by_code["OK"]["principal"] == "operator:operator"
        assert e["method"] == f"/{PROBE}/Submit" and e["since"] <= e["ts"]
    assert by_code["PERMISSION_DENIED"]["principal"] == "tenant:acme"


# -- the freeing lane (issue 30) ------------------------------------------------------


async def test_calls_that_end_work_have_a_lane_new_work_cannot_fill():
    a = Admission(2, 1, 10.0, service="svc", freeing_slots=2)
    assert a.lane("/lightpath.v1.CellScheduler/SubmitJob") is a
    freeing = a.lane("/lightpath.v1.CellScheduler/CompleteJob")
    assert freeing is a.freeing
    for m in ("CancelJob", "ReleaseSlice", "ReleaseRings", "ReleaseReservation", "AbortCommand"):
        assert a.lane(f"/lightpath.v1.X/{m}") is freeing
    # new work fills its slots and its queue: the next is shed
    await a.acquire()
    await a.acquire()
    queued = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted):
        await a.acquire()
    # ... and calls that end work still get in at once, on slots of their own
    await asyncio.wait_for(freeing.acquire(), 0.5)
    await asyncio.wait_for(freeing.acquire(), 0.5)
    assert freeing.inflight == 2 and a.inflight == 2
    freeing.release()
    freeing.release()
    a.release()
    await queued
    a.release()
    a.release()
    assert (a.inflight, freeing.inflight, freeing.borrowed) == (0, 0, 0)


async def test_with_no_load_a_freeing_call_takes_a_free_slot_of_new_work_first():
    a = Admission(2, 0, 0.0, service="svc", freeing_slots=1)
    freeing = a.freeing
    assert freeing is not None
    await freeing.acquire()
    await freeing.acquire()  # the two new-work slots were free
    assert (a.inflight, freeing.borrowed, freeing.inflight) == (2, 2, 0)
    await freeing.acquire()  # then its own
    assert freeing.inflight == 1
    with pytest.raises(ResourceExhausted) as info:
        await freeing.acquire()
    assert "calls that end or release work" in info.value.message
    for _ in range(3):
        freeing.release()
    assert (a.inflight, freeing.borrowed, freeing.inflight) == (0, 0, 0)


async def test_a_service_flooded_with_new_work_still_serves_the_calls_that_end_work(redis_url):
    probe = Probe()

    async def build(runtime):
        return [probe.definition()]

    async with (
        running("probe", _settings(redis_url, 2, 2, 10.0), build) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        hold = _call(ch, "Hold")
        calls = [asyncio.create_task(_outcome(hold(common_pb2.GetInfoRequest()))) for _ in range(8)]
        await _until(lambda: probe.started == 2 and sum(c.done() for c in calls) == 4)
        # new work: 2 in progress, 2 queued, 4 shed; the calls that end work are not
        # queued behind it, nor shed
        complete = _call(ch, "CompleteJob")
        ends = [
            asyncio.create_task(_outcome(complete(common_pb2.GetInfoRequest()))) for _ in range(4)
        ]
        await _until(lambda: probe.started == 6)
        probe.go.set()
        outcomes = await asyncio.gather(*ends)
        assert all(isinstance(o, common_pb2.ServiceInfo) for o in outcomes), outcomes
        await asyncio.gather(*calls)


def test_retry_delays_grow_with_the_share_of_recent_calls_refused():
    from lightpath_services.common.admission import RefusalRate

    now = [0.0]
    rate = RefusalRate(window_s=2.0, clock=lambda: now[0])
    assert rate.fraction() == 0.0
    assert 1.0 <= rate.delay(1.0) <= 1.5  # nothing refused: the base, jittered
    for _ in range(3):
        rate.record(True)
    rate.record(False)
    assert rate.fraction() == 0.75
    assert 4.0 <= rate.delay(0.25) <= 6.0  # a quarter admitted: sixteen times as long
    rate.record(False)
    rate.record(False)
    assert rate.fraction() == 0.5
    assert 4.0 <= rate.delay(1.0) <= 6.0  # half admitted: four times as long
    for _ in range(100):
        rate.record(True)
    assert rate.delay(1.0) == 10.0  # capped
    now[0] += 1.5  # a bucket later the old counts still weigh
    assert rate.fraction() > 0.9
    now[0] += 3.0  # past the window: forgotten
    assert rate.fraction() == 0.0


def test_the_limit_follows_the_latency_of_the_calls_served():
    """Issue 30: slower than the target lowers the slots by a quarter (once per target
    interval, down to 4), faster raises them by 1/limit (up to max_inflight) while half
    of them are in use, and the queue is never longer than the slots."""
    now = [0.0]
    a = Admission(64, 128, 0.5, target_s=0.5, clock=lambda: now[0])
    assert (a.slots, a.queue_places) == (64, 64)
    a.observe(2.0)
    assert a.slots == 48
    a.observe(2.0)  # the same interval: the calls it let in are still finishing
    assert a.slots == 48
    for _ in range(20):
        now[0] += 0.5
        a.observe(2.0)
    assert a.slots == 4 and a.queue_places == 4
    for _ in range(40):
        a.observe(0.1)  # fast, but with nothing in progress: a load that never tests it
    assert a.slots == 4
    for _ in range(40):
        a.inflight = a.slots  # in use: fast calls raise it
        a.observe(0.1)
    assert 8 <= a.slots < 64
    for _ in range(10_000):
        a.inflight = a.slots
        a.observe(0.1)
    assert a.slots == 64
    a.inflight = 0
    fixed = Admission(64, 128, 0.5)
    fixed.observe(10.0)
    assert (fixed.slots, fixed.queue_places) == (64, 128)


async def test_a_lowered_limit_refuses_beyond_it_and_passes_no_slot_on_above_it():
    now = [0.0]
    a = Admission(8, 8, 5.0, target_s=0.5, clock=lambda: now[0])
    for _ in range(8):
        await a.acquire()
    waiter = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    for _ in range(3):
        now[0] += 1.0
        a.observe(3.0)
    assert a.slots == 4
    a.release()  # 7 in progress, more than 4: the slot is not handed on
    await asyncio.sleep(0)
    assert not waiter.done() and a.inflight == 7
    for _ in range(3):
        a.release()
    a.release()  # 3 in progress: now the waiter gets one
    await waiter
    assert a.inflight == 4
    queued = [asyncio.create_task(a.acquire()) for _ in range(4)]  # as many as slots
    await asyncio.sleep(0)
    assert a.queued == 4
    with pytest.raises(ResourceExhausted):
        await a.acquire()  # the queue is as long as the limit: refused at once
    for task in queued:
        task.cancel()
    await asyncio.gather(*queued, return_exceptions=True)


# -- the standing queue (issue 30, CoDel) ------------------------------------------------


async def test_a_standing_queue_refuses_at_its_head_the_calls_that_waited_past_the_target():
    """A queue not empty for STANDING_S stands: a slot coming free skips (refusing) the
    waiters that waited longer than queue_target_s and goes to one that did not."""
    now = [0.0]
    a = Admission(1, 8, 60.0, queue_target_s=5.0, clock=lambda: now[0])
    await a.acquire()
    early = [asyncio.create_task(a.acquire())]
    await asyncio.sleep(0)
    now[0] = 0.5
    assert not a.standing(now[0])
    early.append(asyncio.create_task(a.acquire()))
    await asyncio.sleep(0)
    now[0] = 8.0  # not empty since 0: standing
    assert a.standing(now[0])
    fresh = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    assert a.queued == 3
    a.release()
    await asyncio.sleep(0)
    for task in early:
        with pytest.raises(ResourceExhausted) as refused:
            await task
        assert refused.value.reason == OVERLOADED
        assert "in a queue that has not emptied" in refused.value.message
        assert refused.value.retry_delay_s > 0
    await fresh  # it waited 0 s: it gets the slot
    assert (a.inflight, a.queued, a.shed) == (1, 0, 2)
    assert not a.standing(now[0])  # empty again
    a.release()
    assert a.inflight == 0


async def test_a_queue_that_empties_now_and_then_lets_its_calls_wait_the_full_wait():
    now = [0.0]
    a = Admission(1, 8, 60.0, queue_target_s=0.5, clock=lambda: now[0])
    await a.acquire()
    for t in (0.0, 3.0, 6.0):  # a burst now and then, each served before the next
        now[0] = t
        waiter = asyncio.create_task(a.acquire())
        await asyncio.sleep(0)
        now[0] = t + 0.9  # waited past the target, in a queue not empty for 1 s yet
        assert not a.standing(now[0])
        a.release()
        await waiter
    assert (a.inflight, a.shed) == (1, 0)
    a.release()


async def test_without_a_queue_target_a_standing_queue_still_waits_the_full_wait():
    now = [0.0]
    a = Admission(1, 8, 60.0, clock=lambda: now[0])
    await a.acquire()
    waiter = asyncio.create_task(a.acquire())
    await asyncio.sleep(0)
    now[0] = 30.0
    assert not a.standing(now[0])
    a.release()
    await waiter
    assert a.shed == 0
    a.release()


async def test_calls_that_end_work_are_never_refused_for_a_standing_queue():
    now = [0.0]
    a = Admission(1, 8, 60.0, queue_target_s=0.1, freeing_slots=1, clock=lambda: now[0])
    freeing = a.freeing
    assert freeing is not None and freeing.queue_target_s == 0
    await a.acquire()
    await freeing.acquire()  # its own slot (the new-work one is taken)
    waiter = asyncio.create_task(freeing.acquire())
    await asyncio.sleep(0)
    now[0] = 30.0
    freeing.release()
    await waiter
    assert freeing.shed == 0
    freeing.release()
    a.release()


# -- downstream "busy" counts as a drop (issue 30) ---------------------------------------


def test_a_call_refused_further_down_as_busy_lowers_the_limit_as_a_slow_one():
    now = [0.0]
    a = Admission(64, 128, 0.5, target_s=0.5, clock=lambda: now[0])
    a.observe(0.01, dropped=True)  # fast, but the pod was too busy to take it
    assert a.slots == 48
    a.observe(0.01, dropped=True)  # the same interval: once
    assert a.slots == 48
    now[0] += 0.5
    a.observe(0.01)
    assert a.slots == 48  # a fast call raises it by 1/limit only
    fixed = Admission(64, 128, 0.5)
    fixed.observe(0.01, dropped=True)
    assert fixed.slots == 64


async def test_the_server_counts_a_relayed_pod_busy_as_a_drop_and_a_plain_refusal_not():
    """Through the interceptor: a call answered POD_BUSY lowers the limit; one answered
    with another error, served fast, does not."""
    probe = Probe()
    now = [0.0]
    limiter = Admission(8, 8, 1.0, target_s=0.5, clock=lambda: now[0])
    server, port = create_server("127.0.0.1:0", [probe.definition()], admission=limiter)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:  # no guard here
            boom = await _outcome(_call(ch, "Boom")(common_pb2.GetInfoRequest()))
            assert isinstance(boom, grpc.aio.AioRpcError)
            assert boom.code() == grpc.StatusCode.INTERNAL
            assert limiter.slots == 8
            busy = await _outcome(_call(ch, "Busy")(common_pb2.GetInfoRequest()))
            assert isinstance(busy, grpc.aio.AioRpcError)
            report = error_report(busy)
            assert (report.code, report.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, POD_BUSY)
            assert limiter.slots == 6
            assert limiter.inflight == 0
    finally:
        await server.stop(0)
