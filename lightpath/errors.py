"""Domain errors (X-3): what a client can cause or must handle.

Pure code (services' domain modules, the SDK's graph planner) raises these and
never imports grpc. On a server, services.common.errors.to_status_proto turns
one into a gRPC status whose message names the field and the rule, with
google.rpc details; anything else escaping a servicer is a bug (INTERNAL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ERROR_DOMAIN = "lightpath.dev"


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
