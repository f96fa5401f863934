"""How the cell sorts a pod's failed answer (podclient.classify): refused (nothing kept
there) or unreachable (it may hold the request). Issue 34: a pod answers UNAVAILABLE
WIRING_FAILED when a switch failed while it wired a job that asked not to wait, and it has
forgotten the job, so the cell must not count the job as perhaps held on that pod."""

from __future__ import annotations

import grpc
import pytest

from lightpath.errors import WIRING_FAILED, LightpathError, ResourceExhausted, Unavailable
from lightpath_services.cell_scheduler.podclient import PodRefused, PodUnreachable, classify
from lightpath_services.common.errors import to_status_proto


def answer(err: LightpathError | None, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    trailers = grpc.aio.Metadata()
    if err is not None:
        trailers = grpc.aio.Metadata(
            ("grpc-status-details-bin", to_status_proto(err).SerializeToString())
        )
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, details="x")


@pytest.mark.parametrize(
    ("err", "code", "kind"),
    [
        (Unavailable("a switch failed", reason=WIRING_FAILED), "UNAVAILABLE", PodRefused),
        (Unavailable("redis is down"), "UNAVAILABLE", PodUnreachable),
        (Unavailable("x", reason="POD_UNREACHABLE"), "UNAVAILABLE", PodUnreachable),
        (None, "UNAVAILABLE", PodUnreachable),  # no details: no answer from the pod
        (None, "DEADLINE_EXCEEDED", PodUnreachable),
        (ResourceExhausted("full", reason="NO_CAPACITY"), "RESOURCE_EXHAUSTED", PodRefused),
        # the reason counts only with UNAVAILABLE: a deadline says nothing of what is kept
        (Unavailable("late", reason=WIRING_FAILED), "DEADLINE_EXCEEDED", PodUnreachable),
    ],
)
def test_a_pods_answer_is_sorted_by_what_it_says_is_kept(err, code, kind):
    got = classify("pod-1", answer(err, grpc.StatusCode[code]))
    assert type(got) is kind
    if kind is PodRefused and err is not None:
        relayed = got.relayed()  # the cell answers its caller with the pod's code and reason
        assert (relayed.code, relayed.reason) == (code, err.reason)
