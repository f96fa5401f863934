"""The Lightpath SDK for job systems: typed clients of the cell scheduler and the
core broker and the aggregation switches, each async (`AsyncCell`, `AsyncCores`,
`AsyncAggregation`) and blocking (`Cell`, `Cores`, `Aggregation`).

    from lightpath.sdk import Cell, NotFound

    with Cell() as cell:
        cell.submit("train-7", "8x8x4", tenant="acme")
        cell.wait_running("train-7", timeout=60)

Deadlines (`timeout=`, 10 s a call by default), retries of UNAVAILABLE and the
credentials of the local stack (or LIGHTPATH_TLS_* / LIGHTPATH_TOKEN*) are built
in; failures raise the lightpath.errors class of their status code, with the
server's field violations and reason. docs/sdk.md has the guide.
"""

from lightpath.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    Internal,
    InvalidArgument,
    LightpathError,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from lightpath.sdk.aggregation import Aggregation, AsyncAggregation
from lightpath.sdk.cell import ENDED_STATES, AsyncCell, Cell, JobEnded, WaitTimeout, state_name
from lightpath.sdk.cores import AsyncCores, Cores
from lightpath.security.credentials import Credentials

__all__ = [
    "ENDED_STATES",
    "Aborted",
    "Aggregation",
    "AlreadyExists",
    "AsyncAggregation",
    "AsyncCell",
    "AsyncCores",
    "Cancelled",
    "Cell",
    "Cores",
    "Credentials",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "JobEnded",
    "LightpathError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WaitTimeout",
    "state_name",
]
