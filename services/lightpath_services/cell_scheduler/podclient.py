"""The pods' workload schedulers as the cell calls them (protos/lightpath/v1/workload_scheduler.proto).

Calls go to the endpoint a pod's scheduler registered (the replica heard from
most recently). A failed call is sorted by what it tells the cell:

* `PodRefused` — the pod answered and said no (RESOURCE_EXHAUSTED: no room
  now; INVALID_ARGUMENT / FAILED_PRECONDITION: it cannot take this request).
  Nothing of the request was kept there.
  So is UNAVAILABLE with reason WIRING_FAILED: the pod answered that a switch
  failed while it wired a job that asked not to wait, and forgot the job.
* `PodUnreachable` — no answer (UNAVAILABLE, DEADLINE_EXCEEDED, ...): the
  request may or may not have reached the pod.

Channels are the traced client channels of lightpath.client; a pod that comes
back from silence gets a fresh channel (the old one's reconnect backoff may
have grown to minutes while the pod was away).
"""

from __future__ import annotations

import base64

import grpc
from opentelemetry.sdk.trace import TracerProvider

from lightpath.client import channel, error_report
from lightpath.errors import (
    WIRING_FAILED,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LightpathError,
    Unavailable,
)
from lightpath.security.credentials import Credentials
from lightpath.security.identity import service_principal
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc

REFUSALS = frozenset(
    {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class PodCallError(Exception):
    def __init__(self, pod_id: str, err: grpc.aio.AioRpcError):
        self.pod_id = pod_id
        self.error = err
        self.code = err.code()
        self.report = error_report(err)
        super().__init__(f"pod {pod_id}: {self.code.name}: {err.details() or ''}")

    def relayed(self) -> LightpathError:
        """The pod's error as this service's own answer (same code, field and rule)."""
        r = self.report
        if self.code == grpc.StatusCode.INVALID_ARGUMENT and r.field_violations:
            return InvalidArgument.of(
                [FieldViolation(f, rule) for f, rule in r.field_violations], reason=r.reason or None
            )
        if self.code == grpc.StatusCode.FAILED_PRECONDITION and r.precondition_violations:
            subject, rule = r.precondition_violations[0]
            return FailedPrecondition(subject, rule, reason=r.reason or None)
        if isinstance(self, PodUnreachable):
            return Unavailable(
                f"pod {self.pod_id} is not answering ({self.code.name}: {r.message}); "
                "the cell shows its jobs UNKNOWN until it does",
                reason="POD_UNREACHABLE",
            )
        err = LightpathError(r.message, reason=r.reason or None)
        err.code = self.code.name
        return err


class PodRefused(PodCallError):
    """The pod answered no; nothing of the request was kept there."""


class PodUnreachable(PodCallError):
    """No answer: the request may or may not have reached the pod."""


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def placed_fields(job: workload_scheduler_pb2.Job, spec: workload_scheduler_pb2.JobSpec) -> dict:
    return {
        "spec": base64.b64encode(spec.SerializeToString(deterministic=True)).decode(),
        "chips": "x".join(map(str, job.chips.dims)),
        "blocks": len(job.blocks) or 0,
        "box": box_of(job),
    }


def box_of(job: workload_scheduler_pb2.Job) -> str:
    """The block a sub-block slice's box is in, as the pod answers ("" none: a slice of
    whole blocks, or one holding nothing now). Reclaim reads it (quotas.plan_reclaim)."""
    return str(job.box.block_id) if job.HasField("box") else ""


def classify(pod_id: str, err: grpc.aio.AioRpcError) -> PodCallError:
    refused = err.code() in REFUSALS or (
        err.code() == grpc.StatusCode.UNAVAILABLE and error_report(err).reason == WIRING_FAILED
    )
    return (PodRefused if refused else PodUnreachable)(pod_id, err)


class PodClients:
    """One channel per workload scheduler endpoint and the pod registered there,
    closed with the cell."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        credentials: Credentials,
        *,
        max_attempts: int = 2,
    ):
        self._tracer_provider = tracer_provider
        self._credentials = credentials
        self._max_attempts = max_attempts
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, str], workload_scheduler_pb2_grpc.WorkloadSchedulerStub] = {}

    def stub(self, endpoint: str, pod_id: str) -> workload_scheduler_pb2_grpc.WorkloadSchedulerStub:
        """The stub of `pod_id`'s workload scheduler at `endpoint`: the handshake refuses
        a server that is not `service:workload_scheduler/<pod_id>` (the pod that
        registered there), so nothing meant for one pod reaches another process."""
        key = (endpoint, pod_id)
        stub = self._stubs.get(key)
        if stub is None:
            ch = channel(
                endpoint,
                tracer_provider=self._tracer_provider,
                max_attempts=self._max_attempts,
                credentials=self._credentials,
                expect=service_principal("workload_scheduler", pod_id),
            )
            self._channels[key] = ch
            stub = self._stubs[key] = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)
        return stub

    async def reset(self, endpoint: str) -> None:
        """Forget the channels to `endpoint` (their reconnect backoff may have grown
        while the pod was away)."""
        for key in [k for k in self._channels if k[0] == endpoint]:
            self._stubs.pop(key, None)
            await self._channels.pop(key).close()

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
