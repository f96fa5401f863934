"""Contract tests of UpdateJob on a pod (issue 19): the real workload_scheduler and
ocs_manager over gRPC on a real Redis."""

from __future__ import annotations

import base64
import json

import grpc
import redis.asyncio as aioredis

from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.common.keys import pod_key
from tests.workload_scheduler.conftest import POD, rpc_error

RUNNING, PENDING = c.JOB_STATE_RUNNING, c.JOB_STATE_PENDING


async def _field(redis_url: str, job_id: str, name: str) -> str:
    """One field of the job's record in the pod's Redis."""
    r = aioredis.from_url(redis_url, decode_responses=True)
    try:
        return await r.hget(pod_key(POD, "ws", "job", job_id), name)
    finally:
        await r.aclose()


def _update(job_id: str, paths: list[str], **spec) -> ws.UpdateJobRequest:
    req = ws.UpdateJobRequest(spec=ws.JobSpec(job_id=job_id, **spec))
    req.update_mask.paths.extend(paths)
    return req


async def test_a_queued_job_takes_its_new_place_and_starts_first(pod16):
    await pod16.admit("holder", (16, 8, 4), priority=90)  # 8 blocks
    await pod16.admit("holder2", (16, 8, 4), priority=90)  # the other 8
    for job_id, prio in [("low", 20), ("mid", 50)]:
        assert (await pod16.admit(job_id, (16, 8, 4), priority=prio)).job.state == PENDING
    assert [(await pod16.job(j)).queue_position for j in ("mid", "low")] == [1, 2]

    up = await pod16.ws.UpdateJob(_update("low", ["priority"], priority=70))
    assert up.priority == 70 and up.spec.priority == 70 and up.queue_position == 1
    assert (await pod16.job("mid")).queue_position == 2
    last = up.history[-1]
    assert (last.from_state, last.to_state) == (PENDING, PENDING)
    assert last.reason == "updated: priority 20 → 70"
    view = await pod16.pod()
    assert [(j.job_id, j.priority) for j in view.live_jobs if j.state == PENDING] == [
        ("low", 70),
        ("mid", 50),
    ]
    # 8 blocks free: the job first in the new order runs (the queue index changed too)
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="holder"))
    await pod16.settle()
    assert (await pod16.job("low")).state == RUNNING
    assert (await pod16.job("mid")).state == PENDING
    await pod16.assert_consistent()


async def test_a_running_jobs_new_priority_decides_later_preemption(pod16):
    await pod16.admit("other", (16, 8, 4), priority=90)  # 8 blocks nobody takes
    victim = await pod16.admit("victim", (16, 8, 4), priority=30)  # the other 8
    assert victim.job.state == RUNNING
    # raised above the newcomer's priority, it is no longer preempted
    up = await pod16.ws.UpdateJob(_update("victim", ["priority"], priority=80))
    assert up.state == RUNNING and up.priority == 80 and len(up.blocks) == 8
    hi = await pod16.admit("hi", (16, 8, 4), priority=60)
    assert hi.job.state == PENDING and not hi.preempted
    assert (await pod16.job("victim")).state == RUNNING
    # lowered below it, the waiting job takes its blocks (DELAY: suspended, requeued)
    await pod16.ws.UpdateJob(
        _update("victim", ["priority_class"], priority_class=c.PRIORITY_CLASS_LOW)
    )
    await pod16.settle()
    assert (await pod16.job("hi")).state == RUNNING
    moved = await pod16.job("victim")
    assert moved.state == c.JOB_STATE_SUSPENDED and moved.priority == 20
    await pod16.assert_consistent()


async def test_labels_change_one_by_one_or_all_at_once(pod16, redis_url):
    await pod16.admit("lab", (4, 4, 4), labels={"team": "ml", "env": "dev"})
    up = await pod16.ws.UpdateJob(
        _update("lab", ["labels.env", "labels.team", "labels.owner"], labels={"env": "prod"})
    )
    assert dict(up.spec.labels) == {"env": "prod"}
    assert up.history[-1].reason == "updated: labels set env=prod; labels removed team"
    up = await pod16.ws.UpdateJob(_update("lab", ["labels"], labels={"a": "1", "b": "2"}))
    assert dict(up.spec.labels) == {"a": "1", "b": "2"}
    # asking for what is already there changes nothing and records nothing
    n = len(up.history)
    same = await pod16.ws.UpdateJob(_update("lab", ["labels.a"], labels={"a": "1"}))
    assert len(same.history) == n and same.state == RUNNING
    assert json.loads(await _field(redis_url, "lab", "labels")) == {"a": "1", "b": "2"}


async def test_admitting_the_first_request_again_answers_the_updated_job(pod16, redis_url):
    first = await pod16.admit("idem", (4, 4, 4), priority=40)
    await pod16.ws.UpdateJob(_update("idem", ["priority"], priority=60))
    again = await pod16.admit("idem", (4, 4, 4), priority=40)
    assert not again.created and again.job.priority == 60
    assert {b.block_id for b in again.job.blocks} == {b.block_id for b in first.job.blocks}
    # the spec as admitted is kept apart from the one in use
    raw = await _field(redis_url, "idem", "admitted")
    assert ws.JobSpec.FromString(base64.b64decode(raw)).priority == 40


async def test_refusals_name_the_field_and_change_nothing(pod16):
    await pod16.admit("r1", (4, 4, 4), priority=40)
    before = await pod16.job("r1")
    cases = [
        (_update("r1", []), "update_mask.paths"),
        (_update("r1", ["shape"]), "update_mask.paths[0]"),
        (_update("r1", ["priority", "labels.!"]), "update_mask.paths[1]"),
        (_update("r1", ["priority"], priority=0), "spec.priority"),
        (_update("r1", ["priority"], priority=500), "spec.priority"),
        (_update("bad id", ["priority"], priority=5), "spec.job_id"),
    ]
    for req, field in cases:
        err = await rpc_error(pod16.ws.UpdateJob(req))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (req, err)
        assert field in [f for f, _ in err.field_violations], (req, err)
    after = await pod16.job("r1")
    assert after.priority == 40 and len(after.history) == len(before.history)
    err = await rpc_error(pod16.ws.UpdateJob(_update("ghost", ["priority"], priority=5)))
    assert err.code == grpc.StatusCode.NOT_FOUND
    await pod16.ws.CompleteJob(ws.CompleteJobRequest(job_id="r1"))
    err = await rpc_error(pod16.ws.UpdateJob(_update("r1", ["priority"], priority=5)))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_ENDED"


async def test_the_pod_refuses_what_the_cell_refuses_and_drops_nothing(pod16):
    """Issue 33: UpdateJob at the workload scheduler follows the cell's rules: a path
    named twice or priority with priority_class refused, labels.tenant refused, and a
    whole-map update keeps the tenant label (naming another tenant is refused)."""
    await pod16.admit("acme-1", (16, 8, 4), priority=40, labels={"tenant": "acme", "team": "ml"})
    cases = [
        (["priority", "priority"], {"priority": 60}, "update_mask.paths[1]", "named twice"),
        (
            ["priority", "priority_class"],
            {"priority": 60, "priority_class": c.PRIORITY_CLASS_HIGH},
            "update_mask.paths[1]",
            "conflict",
        ),
        (
            ["labels.tenant"],
            {"labels": {"tenant": "beta"}},
            "update_mask.paths[0]",
            "cannot change",
        ),
        (["labels"], {"labels": {"tenant": "beta"}}, "spec.labels[tenant]", "cannot change"),
    ]
    for paths, spec, field, words in cases:
        err = await rpc_error(pod16.ws.UpdateJob(_update("acme-1", paths, **spec)))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, (paths, err)
        rules = dict(err.field_violations)
        assert field in rules and words in rules[field], (paths, rules)
    job = await pod16.job("acme-1")
    assert job.priority == 40 and dict(job.spec.labels) == {"tenant": "acme", "team": "ml"}
    up = await pod16.ws.UpdateJob(_update("acme-1", ["labels"], labels={"env": "prod"}))
    assert dict(up.spec.labels) == {"tenant": "acme", "env": "prod"}
    assert dict((await pod16.job("acme-1")).spec.labels) == {"tenant": "acme", "env": "prod"}
