"""Domain errors (X-3): what a client can cause or must handle.

Pure code (services' domain modules, the SDK's graph planner) raises these and
never imports grpc. On a server, lightpath_services.common.errors.to_status_proto turns
one into a gRPC status whose message names the field and the rule, with
google.rpc details; anything else escaping a servicer is a bug (INTERNAL).

On a client the same classes come back: `lightpath.client.rpc_error` turns a
failed call into the class of its status code (`error_from_status`), carrying
the decoded details (`violations`, `precondition_violations`, `reason`,
`metadata`, `retry_delay_s`), so `except NotFound` reads the same on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ERROR_DOMAIN = "lightpath.dev"
# The ErrorInfo reason of an UNAVAILABLE that keeps nothing: a pod's answer to a job that
# asked not to wait and whose wiring failed (a switch out of reach). Retryable, and the
# pod has forgotten the job, so a caller does not count it as perhaps held (issue 34).
WIRING_FAILED = "WIRING_FAILED"
# A pod's NOT_FOUND for a job it let go back to the cell queue (a reclaim of lent quota
# delayed it, issue 35): the cell queues it again rather than taking it as lost.
RELEASED_TO_CELL = "RELEASED_TO_CELL"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    rule: str


class LightpathError(Exception):
    """Base of every error a client can cause or must handle.

    `code` is the name of a grpc.StatusCode; `reason` an UPPER_SNAKE id of the
    rule that was broken (google.rpc.ErrorInfo.reason).
    """

    code = "UNKNOWN"
    reason = "LIGHTPATH_ERROR"
    # Decoded from a failed call's google.rpc details (error_from_status); a
    # server-side error sets those it has (InvalidArgument: violations).
    violations: list[FieldViolation] = []  # noqa: RUF012 - read-only default
    precondition_violations: list[FieldViolation] = []  # noqa: RUF012 - (subject, rule)
    retry_delay_s: float | None = None
    # An answer a channel must not repeat on its own although its code is retryable: the
    # server did the call's work and forgot it (a pod's UNAVAILABLE WIRING_FAILED), so a
    # repeat would do it anew. Sent as gRPC's retry pushback "do not retry"
    # (grpc-retry-pushback-ms < 0); the caller still may, knowing what it means.
    final: bool = False
    # Set by the SDK on a client: the address it called and where that came from
    # (a setting, the local stack), for messages like "no cell at ... (from ...)".
    address: str = ""
    address_source: str = ""
    process: str = ""  # the local stack's name of the service called, e.g. "cell-scheduler"

    def __init__(
        self, message: str, *, reason: str | None = None, metadata: Mapping[str, str] | None = None
    ):
        super().__init__(message)
        self.message = message
        if reason:
            self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(LightpathError):
    """A request field breaks a rule: `InvalidArgument("shape.dims[2]", "must be a multiple of 4")`."""

    code = "INVALID_ARGUMENT"
    reason = "INVALID_ARGUMENT"

    def __init__(
        self,
        field: str,
        rule: str,
        *,
        reason: str | None = None,
        more: Iterable[FieldViolation] = (),
        message: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ):
        self.violations = [FieldViolation(field, rule), *more]
        if message is None:
            message = "; ".join(f"{v.field}: {v.rule}" for v in self.violations)
        super().__init__(message, reason=reason, metadata=metadata)

    @classmethod
    def of(
        cls,
        violations: Iterable[FieldViolation],
        *,
        reason: str | None = None,
        message: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> InvalidArgument:
        """`message`, when given, replaces the violations joined (it must still name
        each field and rule)."""
        first, *rest = list(violations)
        return cls(
            first.field, first.rule, reason=reason, more=rest, message=message, metadata=metadata
        )


class NotFound(LightpathError):
    """`NotFound("job", "job-7")` → `job "job-7" not found`."""

    code = "NOT_FOUND"
    reason = "NOT_FOUND"

    def __init__(self, resource_type: str, name: str, *, hint: str = ""):
        self.resource_type = resource_type
        self.name = name
        message = f'{resource_type} "{name}" not found' + (f": {hint}" if hint else "")
        super().__init__(message, reason=f"{resource_type.upper().replace(' ', '_')}_NOT_FOUND")


class FailedPrecondition(LightpathError):
    """The system is not in a state that allows the call: `FailedPrecondition("block 7", "is wired to slice job-3", reason="BLOCK_IN_USE")`."""

    code = "FAILED_PRECONDITION"
    reason = "FAILED_PRECONDITION"

    def __init__(self, subject: str, rule: str, *, reason: str | None = None):
        self.subject = subject
        self.rule = rule
        super().__init__(f"{subject}: {rule}", reason=reason)


class Aborted(LightpathError):
    """A concurrent change won; the caller may retry the whole call."""

    code = "ABORTED"
    reason = "ABORTED"


class _Retryable(LightpathError):
    """An error after which the same call may succeed later: `retry_delay_s`, when
    given, is how long to wait first (google.rpc.RetryInfo)."""

    def __init__(
        self,
        message: str,
        *,
        retry_delay_s: float | None = None,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ):
        super().__init__(message, reason=reason, metadata=metadata)
        self.retry_delay_s = retry_delay_s


class ResourceExhausted(_Retryable):
    """A quota or the server's capacity is used up (load shedding). Not retried blindly
    by the SDK: the caller waits `retry_delay_s`, when given, before it tries again."""

    code = "RESOURCE_EXHAUSTED"
    reason = "RESOURCE_EXHAUSTED"


class Unauthenticated(LightpathError):
    code = "UNAUTHENTICATED"
    reason = "UNAUTHENTICATED"


class PermissionDenied(LightpathError):
    code = "PERMISSION_DENIED"
    reason = "PERMISSION_DENIED"


class Unavailable(_Retryable):
    """A dependency (Redis, a switch driver, a peer service) is down; retry later
    (after `retry_delay_s` when given)."""

    code = "UNAVAILABLE"
    reason = "UNAVAILABLE"


class DeadlineExceeded(LightpathError):
    code = "DEADLINE_EXCEEDED"
    reason = "DEADLINE_EXCEEDED"


class AlreadyExists(LightpathError):
    code = "ALREADY_EXISTS"
    reason = "ALREADY_EXISTS"


class OutOfRange(LightpathError):
    code = "OUT_OF_RANGE"
    reason = "OUT_OF_RANGE"


class Cancelled(LightpathError):
    """The call was cancelled (by the caller, or the server going away mid-call)."""

    code = "CANCELLED"
    reason = "CANCELLED"


class Unimplemented(LightpathError):
    code = "UNIMPLEMENTED"
    reason = "UNIMPLEMENTED"


class Internal(LightpathError):
    """A bug on the server; its log has the details (by the call's trace id)."""

    code = "INTERNAL"
    reason = "INTERNAL"


ERRORS_BY_CODE: dict[str, type[LightpathError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        Aborted,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
        AlreadyExists,
        OutOfRange,
        Cancelled,
        Unimplemented,
        Internal,
    )
}


def error_from_status(
    code: str,
    message: str,
    *,
    reason: str = "",
    metadata: Mapping[str, str] | None = None,
    field_violations: Iterable[tuple[str, str]] = (),
    precondition_violations: Iterable[tuple[str, str]] = (),
    retry_delay_s: float | None = None,
    resource: tuple[str, str] | None = None,
) -> LightpathError:
    """The error of status `code` (a grpc.StatusCode name) as its class in ERRORS_BY_CODE
    (LightpathError for the others, with `code` kept), with what the details said.
    Built without the class's own constructor: the message is the server's, as sent."""
    cls = ERRORS_BY_CODE.get(code, LightpathError)
    err = cls.__new__(cls)
    LightpathError.__init__(err, message, reason=reason or None, metadata=metadata)
    if cls is LightpathError:
        err.code = code
    err.violations = [FieldViolation(f, r) for f, r in field_violations]
    err.precondition_violations = [FieldViolation(s, r) for s, r in precondition_violations]
    err.retry_delay_s = retry_delay_s
    if isinstance(err, FailedPrecondition):
        first = err.precondition_violations[:1]
        err.subject, err.rule = (first[0].field, first[0].rule) if first else ("", message)
    if isinstance(err, NotFound):
        err.resource_type, err.name = resource or ("", "")
    return err
