"""Domain errors (X-3) on the server side: the classes (from lightpath.errors)
and their mapping onto gRPC statuses with google.rpc details."""

from __future__ import annotations

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
    "to_status_proto",
]


def to_status_proto(err: LightpathError):  # -> google.rpc.status_pb2.Status
    """The google.rpc.Status carried in the trailers for `err`."""
    import grpc
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    details = [
        error_details_pb2.ErrorInfo(reason=err.reason, domain=ERROR_DOMAIN, metadata=err.metadata),
    ]
    if isinstance(err, InvalidArgument):
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.rule)
                    for v in err.violations
                ]
            )
        )
    elif isinstance(err, FailedPrecondition):
        details.append(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type=err.reason, subject=err.subject, description=err.rule
                    )
                ]
            )
        )
    elif isinstance(err, NotFound):
        details.append(
            error_details_pb2.ResourceInfo(resource_type=err.resource_type, resource_name=err.name)
        )
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    code = grpc.StatusCode[err.code]
    return status_pb2.Status(
        code=getattr(code_pb2, err.code, code.value[0]), message=err.message, details=packed
    )
