"""The cell's forward fenced at the pod (issue 32): a forward (AdmitJob) older than one
the pod was sent for the job — by a later forward or a take-over's GetJob — is refused
(FAILED_PRECONDITION STALE_LEASE naming forward_token), nothing is admitted, and the
refusal is counted."""

from __future__ import annotations

import grpc

from lightpath.v1 import common_pb2
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.common.txn import STALE_LEASE
from lightpath_services.workload_scheduler import server as ws_server
from lightpath_services.workload_scheduler.metrics import PodMetrics
from tests.metrics_reader import install, value
from tests.workload_scheduler.conftest import pod_stack, rpc_error

C = grpc.StatusCode
REFUSED = "lightpath.pod.stale_forwards_refused"


def forward(job_id: str, token: int) -> ws.AdmitJobRequest:
    spec = ws.JobSpec(job_id=job_id, shape=common_pb2.Shape(dims=[4, 4, 4]))
    return ws.AdmitJobRequest(spec=spec, forward_token=token)


async def test_a_forward_older_than_a_take_over_is_refused_and_counted(redis_url, monkeypatch):
    reader = install(monkeypatch, ws_server, PodMetrics, refresh_s=0.1)
    async with pod_stack(redis_url, blocks=4) as pod:
        assert value(reader, REFUSED) == 0
        # a take-over (token 7) asks before the forward it took over (token 5) arrives
        err = await rpc_error(pod.ws.GetJob(ws.GetJobRequest(job_id="j", forward_token=7)))
        assert err.code == C.NOT_FOUND
        err = await rpc_error(pod.ws.AdmitJob(forward("j", 5)))
        assert err.code == C.FAILED_PRECONDITION and err.reason == STALE_LEASE
        assert "forward_token" in err.message and "nothing was admitted" in err.message
        assert (await rpc_error(pod.job("j"))).code == C.NOT_FOUND
        assert value(reader, REFUSED) == 1
        # the take-over's own forward (a newer token) is admitted; a retry of it too
        first = await pod.ws.AdmitJob(forward("j", 8))
        assert first.created and first.job.state == common_pb2.JOB_STATE_RUNNING
        assert not (await pod.ws.AdmitJob(forward("j", 8))).created
        # the stale forward again, now that the job exists: still refused
        err = await rpc_error(pod.ws.AdmitJob(forward("j", 5)))
        assert err.code == C.FAILED_PRECONDITION and err.reason == STALE_LEASE
        # an older take-over is refused too; unfenced calls (an operator's) are not checked
        err = await rpc_error(pod.ws.GetJob(ws.GetJobRequest(job_id="j", forward_token=6)))
        assert err.code == C.FAILED_PRECONDITION and err.reason == STALE_LEASE
        assert value(reader, REFUSED) == 3
        assert (await pod.job("j")).state == common_pb2.JOB_STATE_RUNNING
        assert not (await pod.ws.AdmitJob(forward("j", 0))).created


async def test_a_forward_token_beyond_what_scripts_compare_exactly_is_refused(redis_url):
    async with pod_stack(redis_url, blocks=4) as pod:
        err = await rpc_error(pod.ws.AdmitJob(forward("j", 2**53)))
        assert err.code == C.INVALID_ARGUMENT and "forward_token" in err.message
