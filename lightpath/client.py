"""Client SDK: channels with deadlines, retries and tracing, and readable errors.

    from lightpath.client import channel, stub
    from lightpath.v1 import cell_scheduler_pb2_grpc

    async with channel("127.0.0.1:50051") as ch:
        cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        info = await cell.GetInfo(common_pb2.GetInfoRequest())

* Every call that returns one response gets a deadline (default 10 s) unless
  it sets its own; streams have none by default.
* UNAVAILABLE is retried by gRPC itself with exponential backoff (the
  channel's service config). Lightpath mutations are idempotent by
  client-chosen ids (X-5), so a retry never does a thing twice; an answer that
  says "done, and forgotten" (`LightpathError.final`: a pod's no-wait job whose
  wiring failed) carries gRPC's "do not retry" pushback instead. A service
  answers UNAVAILABLE when its Redis is unreachable, loading, read-only or its
  connection pool is exhausted, with a google.rpc.RetryInfo delay
  (`ErrorReport.retry_delay_s`).
* RESOURCE_EXHAUSTED (no capacity now, a quota, load shedding) is NOT retried
  by the channel: retrying at once would add to the load that caused it. The
  caller decides, waiting at least `error_report(err).retry_delay_s` when the
  server gave one.
* `rpc_error(err)` turns a failed call into the lightpath.errors class of its
  code (NotFound, InvalidArgument, ...) with the details decoded; the SDK
  (lightpath.sdk) raises those.
* A peer that was down is reached again within `MAX_RECONNECT_BACKOFF_MS` (2 s, with
  gRPC's 20 % jitter) of its return, however long it was away. gRPC's own bound is
  120 s: after a 20 s outage a channel on its defaults failed calls fast for another
  6 s, after a few minutes' for up to two minutes more. Reconnecting costs a TCP
  connect (and a TLS handshake once one succeeds), so a short bound is cheap.
* Calls are traced (lightpath.telemetry) and carry the trace context.
* Whom it reached: `expect=<principal>` makes the TLS handshake check the server's
  certificate against that identity (`identity.dns_name`, a DNS SAN every
  certificate of the local CA carries), so a server holding another identity's
  certificate, even one from the same CA, is refused before any request is sent;
  the call fails UNAVAILABLE naming the identity expected and the one found.
* Credentials (lightpath.security.credentials): TLS with the caller's
  certificate and/or a bearer token; by default whatever
  `Credentials.default()` finds (the local stack's operator certificate, or
  LIGHTPATH_TLS_* / LIGHTPATH_TOKEN*).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.sdk.trace import TracerProvider

from lightpath.errors import LightpathError, error_from_status
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, dns_name, from_uri
from lightpath.telemetry import client_interceptors

DEFAULT_TIMEOUT_S = 10.0
# How soon a channel tries again to connect to a peer it lost (see the module doc).
INITIAL_RECONNECT_BACKOFF_MS = 250
MAX_RECONNECT_BACKOFF_MS = 2000


# Only UNAVAILABLE: never RESOURCE_EXHAUSTED (see the module docstring), nor
# ABORTED/INTERNAL, which a blind retry would only repeat.
RETRYABLE_STATUS_CODES = ("UNAVAILABLE",)


def retry_service_config(max_attempts: int = 5) -> str:
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{}],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.05s",
                        "maxBackoff": "1s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": list(RETRYABLE_STATUS_CODES),
                    },
                }
            ]
        }
    )


def channel(
    address: str,
    *,
    tracer_provider: TracerProvider | None = None,
    default_timeout: float | None = DEFAULT_TIMEOUT_S,
    max_attempts: int = 5,
    credentials: Credentials | None = None,
    expect: Principal | None = None,
) -> grpc.aio.Channel:
    """An aio channel to a Lightpath service on `address` (host:port), over TLS when
    `credentials` (default: `Credentials.default()`) have a CA; with `expect`, only to
    a server whose certificate is that identity's (see the module doc)."""
    creds = Credentials.default() if credentials is None else credentials
    options: list[tuple[str, Any]] = [
        ("grpc.enable_retries", 1 if max_attempts > 1 else 0),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
    if max_attempts > 1:
        options.append(("grpc.service_config", retry_service_config(max_attempts)))
    interceptors: list[grpc.aio.ClientInterceptor] = client_interceptors(
        tracer_provider, default_timeout, creds.metadata()
    )
    channel_creds = creds.channel_credentials()
    if channel_creds is not None and expect is not None:
        options.append(("grpc.ssl_target_name_override", dns_name(expect)))
        interceptors.insert(0, _PeerCheck(address, expect, creds.ca))
    if channel_creds is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(
        address, channel_creds, options=options, interceptors=interceptors
    )


# What gRPC says when the server's certificate does not carry the name checked.
_NAME_MISMATCH = ("Hostname Verification Check failed", "not in peer certificate")


# What a call refused that way says (after _PeerCheck): nothing reached the server.
REFUSED_IN_HANDSHAKE = "refused in the TLS handshake, nothing was sent"


def wrong_peer(err: grpc.RpcError) -> bool:
    """The call failed because the server is not the identity the channel expects (so
    the request never left this process)."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    return code == grpc.StatusCode.UNAVAILABLE and any(
        m in details for m in (*_NAME_MISMATCH, REFUSED_IN_HANDSHAKE)
    )


async def presented_identity(address: str, ca: bytes | None, timeout: float = 1.0) -> str:
    """Who the server at `address` says it is: the principal of its certificate's URI
    SAN ("unknown" when it cannot be read within `timeout`). One TLS handshake, made
    only after a call was refused for the server's identity."""
    import ssl

    from cryptography import x509

    host, _, port = address.rpartition(":")
    host = host.removeprefix("ipv4:").removeprefix("dns:").strip("[]/")
    try:
        ctx = ssl.create_default_context(cadata=ca.decode() if ca else None)
        ctx.check_hostname = False
        ctx.set_alpn_protocols(["h2"])
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=""), timeout
        )
    except (OSError, ValueError, TimeoutError, ssl.SSLError):
        return "unknown"
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object else None
        if not der:
            return "unknown"
        cert = x509.load_der_x509_certificate(der)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
            principal = from_uri(uri)
            if principal is not None:
                return str(principal)
        return "no Lightpath identity"
    except (ValueError, x509.ExtensionNotFound):
        return "no Lightpath identity"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), timeout)


class _PeerCheck(grpc.aio.UnaryUnaryClientInterceptor):
    """A unary call refused for the server's identity fails UNAVAILABLE naming the
    identity expected and the one found (nothing was sent: the handshake failed)."""

    def __init__(self, address: str, expect: Principal, ca: bytes | None):
        self.address = address
        self.expect = expect
        self.ca = ca

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        try:
            call = await continuation(client_call_details, request)
            await call
        except grpc.aio.AioRpcError as err:
            if not wrong_peer(err) or REFUSED_IN_HANDSHAKE in (err.details() or ""):
                raise
            found = await presented_identity(self.address, self.ca)
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details=(
                    f"{self.address} is not {self.expect}: its certificate names {found} "
                    f"({REFUSED_IN_HANDSHAKE})"
                ),
            ) from None
        return call


@dataclass
class ErrorReport:
    """What a failed call says, details decoded (see common.proto for the conventions)."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    precondition_violations: list[tuple[str, str]] = field(default_factory=list)
    retry_delay_s: float | None = None  # google.rpc.RetryInfo: wait this long before a retry
    metadata: dict[str, str] = field(default_factory=dict)  # google.rpc.ErrorInfo.metadata
    resource: tuple[str, str] | None = None  # google.rpc.ResourceInfo: (type, name)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def error_report(err: grpc.aio.AioRpcError | grpc.RpcError) -> ErrorReport:
    report = ErrorReport(code=err.code(), message=err.details() or "")
    trailers = err.trailing_metadata() or ()
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:  # not a google.rpc.Status: the code and message are all there is
            continue
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                report.reason = info.reason
                report.metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                report.field_violations = [(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
                pre = error_details_pb2.PreconditionFailure()
                detail.Unpack(pre)
                report.precondition_violations = [
                    (v.subject, v.description) for v in pre.violations
                ]
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                report.retry_delay_s = retry.retry_delay.ToNanoseconds() / 1e9
            elif detail.Is(error_details_pb2.ResourceInfo.DESCRIPTOR):
                res = error_details_pb2.ResourceInfo()
                detail.Unpack(res)
                report.resource = (res.resource_type, res.resource_name)
    return report


def rpc_error(err: grpc.aio.AioRpcError | grpc.RpcError) -> LightpathError:
    """The lightpath.errors exception of a failed call (NotFound, InvalidArgument, ...:
    one class per status code), with its details decoded; `raise rpc_error(err) from err`."""
    report = error_report(err)
    return error_from_status(
        report.code.name,
        report.message,
        reason=report.reason,
        metadata=report.metadata,
        field_violations=report.field_violations,
        precondition_violations=report.precondition_violations,
        retry_delay_s=report.retry_delay_s,
        resource=report.resource,
    )


# Services whose proto is not named after them: package name -> (proto module, service).
_STUBS = {"switch_agent": ("optical_switch", "OpticalSwitchAdmin")}


def service_stub(service: str, ch: grpc.aio.Channel) -> Any:
    """The generated stub of a service by its package name ("ocs_manager" → OcsManagerStub;
    "switch_agent" → OpticalSwitchAdminStub, where its GetInfo is)."""
    import importlib

    module_name, name = _STUBS.get(
        service, (service, "".join(p.capitalize() for p in service.split("_")))
    )
    module = importlib.import_module(f"lightpath.v1.{module_name}_pb2_grpc")
    return getattr(module, name + "Stub")(ch)
