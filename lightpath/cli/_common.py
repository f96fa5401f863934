"""Helpers shared by the CLI topics: --json output, tables, readable errors.

Errors a person reads say what went wrong and what to do next (run `lightpath up`,
`lightpath tenant create acme`, `--as operator`, ...); `report_rpc_error` does it
for gRPC errors, `report_credentials_error` for a credential the CLI cannot find.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from lightpath.client import error_report
from lightpath.security.credentials import Credentials, CredentialsError


class CliError(Exception):
    """A problem the CLI itself finds (no stack, no CA, a bad filter): `error: <message>`
    on stderr and exit code `code`, no traceback."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message = message
        self.code = code


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def to_jsonable(value: Any) -> Any:
    if isinstance(value, Message):
        return json_format.MessageToDict(value, preserving_proto_field_name=True)
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, sort_keys=True))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers)), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_rpc(fn: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run an async CLI action; a gRPC error becomes a readable message (with what to do
    next) on stderr and exit code 1; a credential the CLI cannot find, exit code 2."""
    try:
        return int(asyncio.run(fn()) or 0)
    except grpc.aio.AioRpcError as err:
        report_rpc_error(err)
        return 1
    except CredentialsError as exc:
        report_credentials_error(exc)
        return 2


def report_credentials_error(exc: Exception) -> None:
    print(f"error: {exc}", file=sys.stderr)


def report_rpc_error(err: grpc.aio.AioRpcError | grpc.RpcError) -> None:
    """`error: CODE: message`, the field violations, then `next: ...` lines."""
    report = error_report(err)
    print(f"error: {report}", file=sys.stderr)
    for field, rule in report.field_violations:
        print(f"  {field}: {rule}", file=sys.stderr)
    for subject, rule in report.precondition_violations:
        if rule not in report.message:
            print(f"  {subject}: {rule}", file=sys.stderr)
    for line in next_steps(report.code, report.message, report.reason, error_metadata(err)):
        print(f"next: {line}", file=sys.stderr)
    from lightpath.cli.tracing import print_trace_id

    print_trace_id()


def error_metadata(err: grpc.aio.AioRpcError | grpc.RpcError) -> dict[str, str]:
    """google.rpc.ErrorInfo.metadata of a failed call ({} when it has none)."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key != "grpc-status-details-bin":
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:
            return {}
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return dict(info.metadata)
    return {}


def current_credentials() -> Credentials | None:
    """What this command presents (None when even that cannot be worked out)."""
    try:
        return Credentials.default()
    except CredentialsError:
        return None


def presented_principal(creds: Credentials | None) -> str:
    """`kind:name` of the client certificate in `creds`, '' without one."""
    principal = creds.certificate_principal() if creds is not None else None
    return str(principal) if principal is not None else ""


def _token_source() -> str:
    if os.environ.get("LIGHTPATH_TOKEN_FILE"):
        return f"LIGHTPATH_TOKEN_FILE ({os.environ['LIGHTPATH_TOKEN_FILE']})"
    return "LIGHTPATH_TOKEN"


def describe_credentials(creds: Credentials | None) -> str:
    """The certificate this command presents, or why it presents none, in words."""
    from lightpath.paths import pki_dir

    if creds is None:
        return "no usable credential"
    if creds.source.startswith("plaintext"):
        return "LIGHTPATH_PLAINTEXT is set"
    if creds.source == "LIGHTPATH_TLS_*":
        return (
            f"the certificate in LIGHTPATH_TLS_CERT ({os.environ.get('LIGHTPATH_TLS_CERT', '')})"
            if creds.cert
            else "LIGHTPATH_TLS_CA is set but LIGHTPATH_TLS_CERT is not"
        )
    if creds.source.startswith("local"):
        who = presented_principal(creds) or creds.source.removeprefix("local ")
        return f"the local stack's certificate of {who}, in {pki_dir()}"
    return f"LIGHTPATH_TLS_* are unset and {pki_dir()} has no local stack's certificates"


def next_steps(
    code: grpc.StatusCode, message: str, reason: str, metadata: dict[str, str]
) -> list[str]:
    """What a person can do about a failed call, in the CLI's words."""
    creds = current_credentials()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if reason == "INVALID_CREDENTIAL":
            return [
                f"the bearer token from {_token_source()} is unknown or revoked: "
                "`lightpath token list` shows the valid ones, `lightpath token create KIND:NAME` "
                "issues a new one; unset it to call with your certificate"
            ]
        if reason == "MALFORMED_CREDENTIAL":
            return [f"{_token_source()} must hold the token itself (lpt1.…), without `Bearer `"]
        return [
            "this command presented "
            + (
                describe_credentials(creds)
                if creds is not None and creds.cert
                else f"no certificate ({describe_credentials(creds)})"
            ),
            "on the local stack, `lightpath up` makes the operator's certificate (point "
            "--state-dir / LIGHTPATH_STATE_DIR at the stack's directory) and "
            "`lightpath tenant create NAME` a tenant's, used with `--as NAME`",
            "with your own PKI set LIGHTPATH_TLS_CA, LIGHTPATH_TLS_CERT and LIGHTPATH_TLS_KEY, "
            "or LIGHTPATH_TOKEN_FILE to a bearer token",
        ]
    if code == grpc.StatusCode.PERMISSION_DENIED:
        if reason == "ROLE_REQUIRED":
            roles = [r.strip() for r in metadata.get("roles", "").split(" or ") if r.strip()]
            if "operator" in roles:
                return [
                    "run it as an operator: `--as operator` on the local stack, "
                    "or with an operator's certificate or token"
                ]
            if "tenant" in roles:
                return [
                    "run it as a tenant: `--as TENANT` (after `lightpath tenant create TENANT`)"
                ]
            if "application" in roles:
                return ["call it with a core broker application's token (`--token`)"]
            return []
        if reason == "TENANT_MISMATCH":
            return [
                "a tenant's credential acts only for its own tenant: leave --tenant out, "
                "or use `--as <that tenant>`"
            ]
        return []
    if code == grpc.StatusCode.UNAVAILABLE:
        return _unavailable_steps(message, creds)
    if code == grpc.StatusCode.NOT_FOUND:
        who = presented_principal(creds)
        if who.startswith("tenant:") and not (creds and creds.token):
            return [
                f"as {who} you see only what belongs to tenant {who.partition(':')[2]}; "
                "an operator (`--as operator`) sees everything"
            ]
    return []


def _unavailable_steps(message: str, creds: Credentials | None) -> list[str]:
    text = message.lower()
    presented = describe_credentials(creds)
    local = (
        "on the local stack, use its own directory (--state-dir / LIGHTPATH_STATE_DIR: its pki/ "
        "has the certificates)"
    )
    if "socket closed" in text and (creds is None or not creds.cert):
        steps = [
            "the service requires TLS with a client certificate, and this command presents "
            f"none ({presented})"
        ]
        if creds is not None and creds.source.startswith("plaintext"):
            steps.append(f"unset LIGHTPATH_PLAINTEXT; {local}")
        else:
            steps.append(f"{local}; with your own PKI set LIGHTPATH_TLS_CERT and LIGHTPATH_TLS_KEY")
        return steps
    if "socket closed" in text:
        return [
            "the service closed the connection in the TLS handshake: it probably does not "
            f"accept this command's certificate ({presented}), issued by another CA",
            f"{local}; with your own PKI check LIGHTPATH_TLS_CERT and LIGHTPATH_TLS_KEY; "
            "`lightpath whoami` shows what a command presents",
        ]
    if any(s in text for s in ("handshake", "ssl", "certificate_verify", "tsi_")):
        return [
            "the TLS handshake failed: this command does not trust the service's certificate "
            "(issued by another CA than the one it trusts), or the service does not serve TLS",
            f"{local}; with your own PKI check LIGHTPATH_TLS_CA",
        ]
    if "connection refused" in text or "failed to connect" in text:
        return [
            "is the service running? `lightpath status` shows the local stack, "
            "`lightpath up` starts it"
        ]
    return []


# What `--as` sets aside for the command: your own PKI and bearer tokens, so the
# channel presents the local stack's credential of the identity asked for
# (`Credentials.default(identity)`), not whatever the environment holds.
_SET_ASIDE_BY_AS = (
    "LIGHTPATH_TLS_CA",
    "LIGHTPATH_TLS_CERT",
    "LIGHTPATH_TLS_KEY",
    "LIGHTPATH_TOKEN",
    "LIGHTPATH_TOKEN_FILE",
)


@contextlib.contextmanager
def acting_as(identity: str | None) -> Iterator[None]:
    """Every channel opened in the block presents the local stack's credential of `identity`
    (`operator`, `acme` = tenant:acme, `kind:name`); no-op for None. The environment is
    restored afterwards (the CLI runs in-process in tests and scripts)."""
    if not identity:
        yield
        return
    from lightpath.security.credentials import identity_of
    from lightpath.security.identity import IdentityError

    try:
        identity_of(identity)
    except IdentityError as exc:
        raise CredentialsError(f"--as {identity}: {exc}") from None
    keys = (*_SET_ASIDE_BY_AS, "LIGHTPATH_IDENTITY")
    saved = {k: os.environ.get(k) for k in keys}
    for k in _SET_ASIDE_BY_AS:
        os.environ.pop(k, None)
    os.environ["LIGHTPATH_IDENTITY"] = identity
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
