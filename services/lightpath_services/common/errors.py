"""Domain errors (X-3) on the server side: the classes (from lightpath.errors),
the one mapping of infrastructure failures onto them (`from_redis`), and their
mapping onto gRPC statuses with google.rpc details."""

from __future__ import annotations

from redis import exceptions as redis_errors

from lightpath import redis_url
from lightpath.errors import (
    ERROR_DOMAIN,
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LightpathError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "ERROR_DOMAIN",
    "Aborted",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
    "LightpathError",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "from_redis",
    "to_status_proto",
]

# What each Redis failure means to a caller, and how long it should wait before
# retrying, most specific first (BusyLoadingError, MaxConnectionsError and
# AuthenticationError are ConnectionErrors; ReadOnlyError, TryAgainError and
# ClusterDownError are ResponseErrors that say nothing about the request).
_REDIS_UNAVAILABLE: tuple[
    tuple[type[Exception] | tuple[type[Exception], ...], str, str, float], ...
] = (
    (
        redis_errors.BusyLoadingError,
        "REDIS_LOADING",
        "Redis is loading its dataset into memory (it just restarted)",
        1.0,
    ),
    (
        redis_errors.MaxConnectionsError,
        "REDIS_POOL_EXHAUSTED",
        "every connection of this service's Redis pool is busy (LIGHTPATH_REDIS_MAX_CONNECTIONS)",
        0.2,
    ),
    (
        (redis_errors.AuthenticationError, redis_errors.AuthorizationError),
        "REDIS_AUTH_FAILED",
        "Redis refused this service's credentials (an operator must fix "
        "LIGHTPATH_REDIS_PASSWORD_FILE)",
        5.0,
    ),
    (
        redis_errors.ReadOnlyError,
        "REDIS_READ_ONLY",
        "Redis is a read-only replica (a failover is under way)",
        1.0,
    ),
    (
        redis_errors.TryAgainError,
        "REDIS_UNAVAILABLE",
        "Redis asked to try again (a cluster slot is moving)",
        0.2,
    ),
    (
        redis_errors.ClusterDownError,
        "REDIS_UNAVAILABLE",
        "the Redis cluster is down (or a master is failing over)",
        1.0,
    ),
    (
        redis_errors.SlotNotCoveredError,
        "REDIS_UNAVAILABLE",
        "no Redis Cluster node serves this state's slot yet (a failover is under way)",
        1.0,
    ),
    (redis_errors.TimeoutError, "REDIS_TIMEOUT", "Redis did not answer in time", 0.5),
    (redis_errors.ConnectionError, "REDIS_UNREACHABLE", "Redis cannot be reached", 0.5),
)
# What redis.asyncio.BlockingConnectionPool raises (a plain ConnectionError) when
# no connection came free within LIGHTPATH_REDIS_POOL_TIMEOUT_S.
_POOL_WAIT_TIMED_OUT = "No connection available"


def from_redis(exc: BaseException) -> Unavailable | ResourceExhausted | None:
    """What a Redis failure escaping a servicer means to the caller (X-3), or None
    when `exc` is not one (then it is a bug: INTERNAL).

    Connection, timeout, loading, read-only-replica and pool-exhaustion errors say
    nothing about the request and pass: UNAVAILABLE with a retry delay, which the
    SDK retries (Lightpath's mutations are idempotent by client-chosen ids, X-5).
    A Redis out of memory (maxmemory) is RESOURCE_EXHAUSTED: retrying at once would
    not help. A wrong password at runtime is UNAVAILABLE too (the service cannot
    serve until an operator fixes it), with a longer delay. An exception group
    (asyncio.TaskGroup) maps when every exception in it is such a failure.
    """
    if isinstance(exc, BaseExceptionGroup):
        mapped = [from_redis(e) for e in exc.exceptions]
        if mapped and all(m is not None for m in mapped):
            return mapped[0]
        return None
    if isinstance(exc, redis_errors.OutOfMemoryError):
        err: Unavailable | ResourceExhausted = ResourceExhausted(
            "Redis is out of memory (maxmemory reached); retry once memory has been freed",
            reason="REDIS_OUT_OF_MEMORY",
            retry_delay_s=5.0,
        )
        err.__cause__ = exc
        return err
    found = next((row for row in _REDIS_UNAVAILABLE if isinstance(exc, row[0])), None)
    if found is None and isinstance(exc, redis_errors.ResponseError):
        # A script's write or a WAIT on a replica: redis-py raises a plain ResponseError.
        if any(text in str(exc) for text in redis_url.DEMOTED):
            found = next(row for row in _REDIS_UNAVAILABLE if row[1] == "REDIS_READ_ONLY")
    if found is None:
        return None
    _cls, reason, what, delay = found
    if reason == "REDIS_UNREACHABLE" and _POOL_WAIT_TIMED_OUT in str(exc):
        reason = "REDIS_POOL_EXHAUSTED"
        what = (
            "no connection of this service's Redis pool came free in time "
            "(LIGHTPATH_REDIS_MAX_CONNECTIONS, LIGHTPATH_REDIS_POOL_TIMEOUT_S)"
        )
        delay = 0.2
    retry = "" if reason == "REDIS_AUTH_FAILED" else f"; the call may be retried in {delay:g} s"
    err = Unavailable(
        f"{what} ({type(exc).__name__}){retry}",
        reason=reason,
        retry_delay_s=delay,
        metadata={"error": type(exc).__name__},
    )
    err.__cause__ = exc
    return err


# An error is a few hundred bytes whatever the request held (issue 30): a message,
# each detail string and the number of violations are cut to these.
MAX_MESSAGE = 1024
MAX_DETAIL = 256
MAX_VIOLATIONS = 16
MAX_METADATA = 16


def short(text: str, limit: int = MAX_DETAIL) -> str:
    """`text`, cut to `limit` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_status_proto(err: LightpathError):  # -> google.rpc.status_pb2.Status
    """The google.rpc.Status carried in the trailers for `err` (every string in it
    cut to MAX_MESSAGE or MAX_DETAIL characters)."""
    import grpc
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    metadata = {short(k, 64): short(str(v)) for k, v in list(err.metadata.items())[:MAX_METADATA]}
    details = [
        error_details_pb2.ErrorInfo(
            reason=short(err.reason, 64), domain=ERROR_DOMAIN, metadata=metadata
        ),
    ]
    if isinstance(err, InvalidArgument):
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=short(v.field), description=short(v.rule)
                    )
                    for v in err.violations[:MAX_VIOLATIONS]
                ]
            )
        )
    elif isinstance(err, FailedPrecondition):
        details.append(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type=short(err.reason, 64),
                        subject=short(err.subject),
                        description=short(err.rule),
                    )
                ]
            )
        )
    elif isinstance(err, NotFound):
        details.append(
            error_details_pb2.ResourceInfo(
                resource_type=short(err.resource_type), resource_name=short(err.name)
            )
        )
    retry_delay_s = getattr(err, "retry_delay_s", None)
    if retry_delay_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(round(retry_delay_s * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    code = grpc.StatusCode[err.code]
    return status_pb2.Status(
        code=getattr(code_pb2, err.code, code.value[0]),
        message=short(err.message, MAX_MESSAGE),
        details=packed,
    )
