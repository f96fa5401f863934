"""Helpers shared by the CLI topics: output (--json, -o, tables), readable errors.

Output: `--json` prints every field of the answer, zeros included, numbers as
numbers (`to_jsonable`); streams print one compact object a line. Every command with
`--json` takes `-o table|wide|json|yaml|name|jsonpath=TEMPLATE` too (`render` prints
the answer in the format asked; jsonpath as kubectl's: `{.state}`,
`{range .jobs[*]}{.job_id}{"\n"}{end}`); list commands also `--no-headers` and
`--sort-by PATH` (`add_list_output`, `print_list`). With JSON or YAML output an error
is one JSON object on stderr (`{"error": {...}}`) and the exit code is not 0.

Errors a person reads say what went wrong and what to do next (run `lightpath up`,
`lightpath tenant create acme`, `--as operator`, ...); `report_error` does it
for a failed call (a lightpath.errors class, as the SDK raises them),
`report_credentials_error` for a credential the CLI cannot find.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from lightpath.client import rpc_error
from lightpath.errors import LightpathError
from lightpath.security.credentials import Credentials, CredentialsError

OUTPUT_FORMATS = ("table", "wide", "json", "yaml", "name", "jsonpath=TEMPLATE")
_PLAIN_FORMATS = OUTPUT_FORMATS[:-1]


class CliError(Exception):
    """A problem the CLI itself finds (no stack, no CA, a bad filter): `error: <message>`
    on stderr and exit code `code`, no traceback."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message = message
        self.code = code


class _Output:
    """How this command prints: `json` True with --json / -o json|yaml (errors as JSON);
    `format` the -o asked for (json with --json, table without either)."""

    json = False
    format = "table"


OUTPUT = _Output()


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False)) or getattr(args, "output", None) in ("json", "yaml")


def short_name(enum: Any, value: int) -> str:
    """How a person reads an enum value, in every table, filter, message and the console:
    its name without the enum's prefix, in capitals (AGG_NODE_KIND_SWITCH → SWITCH,
    JOB_STATE_RUNNING → RUNNING). JSON keeps the API's whole name (docs/usage.md)."""
    name = str(enum.Name(value))
    zero = str(enum.Name(0)) if 0 in enum.values() else ""
    prefix = zero.removesuffix("UNSPECIFIED") if zero.endswith("_UNSPECIFIED") else ""
    return name.removeprefix(prefix) if prefix else name


def output_type(raw: str) -> str:
    """An -o value: one of OUTPUT_FORMATS, jsonpath with a template that parses."""
    if raw in _PLAIN_FORMATS:
        return raw
    if raw.startswith("jsonpath="):
        from lightpath.cli.jsonpath import JsonPathError, parse

        try:
            parse(raw.removeprefix("jsonpath="))
        except JsonPathError as exc:
            raise argparse.ArgumentTypeError(f"{raw}: {exc}") from None
        return raw
    raise argparse.ArgumentTypeError(
        f"{raw!r} is no output format: give one of {', '.join(_PLAIN_FORMATS)} or "
        "jsonpath=TEMPLATE (e.g. -o jsonpath={.state})"
    )


def add_json_flag(parser: argparse.ArgumentParser, *, listing: bool = False) -> None:
    """--json and -o/--output of a command (a list command: `add_list_output`)."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print machine-readable JSON: every field, zeros included; errors as one JSON "
        "object on stderr",
    )
    add_output_flag(parser, listing=listing)


def add_output_flag(parser: argparse.ArgumentParser, *, listing: bool = False) -> None:
    if "-o" in parser._option_string_actions:
        return
    parser.add_argument(
        "-o",
        "--output",
        type=output_type,
        metavar="FORMAT",
        default=None,
        help="table (default), wide (every column, nothing shortened), json (= --json), "
        "yaml, name ("
        + ("one id a line" if listing else "its id")
        + "), or jsonpath=TEMPLATE (kubectl's: -o jsonpath={.state})",
    )


def add_list_output(parser: argparse.ArgumentParser) -> None:
    """--json, -o/--output, --no-headers and --sort-by of a list command."""
    add_json_flag(parser, listing=True)
    parser.add_argument(
        "--no-headers", action="store_true", help="tables without the header lines (scripts)"
    )
    parser.add_argument(
        "--sort-by",
        metavar="PATH",
        help="sort by this field of each item's JSON, e.g. --sort-by .priority or "
        "--sort-by created_at",
    )


def add_parallelism_flags(parser: argparse.ArgumentParser, *, default: int, note: str = "") -> None:
    """--data, --pipeline and --layer: the degrees of the three kinds of parallelism."""
    for degree in ("data", "pipeline", "layer"):
        parser.add_argument(
            f"--{degree}",
            type=int,
            default=default,
            metavar="N",
            help=f"{degree}-parallelism degree; the three multiply to the chip count{note}",
        )


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_seconds(raw: str) -> float:
    """`90`, `90s`, `250ms`, `5m`, `1.5h` → seconds."""
    m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*", raw)
    if not m:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a duration like 90s, 5m, 250ms")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def output_format(args: argparse.Namespace) -> str:
    """The -o asked for; json with --json alone; table without either."""
    fmt = getattr(args, "output", None)
    if fmt:
        return str(fmt)
    return "json" if getattr(args, "json", False) else "table"


def structured(fmt: str) -> bool:
    """Whether `fmt` prints the answer's data (json, yaml, name, jsonpath), not a table."""
    return fmt not in ("table", "wide")


def render(data: Any, fmt: str | None = None, *, name: Callable[[Any], str] | None = None) -> str:
    """JSON data (`to_jsonable`) in the output format `fmt` (default: the command's)."""
    fmt = fmt or OUTPUT.format
    if fmt == "yaml":
        return to_yaml(data)
    if fmt.startswith("jsonpath="):
        from lightpath.cli.jsonpath import evaluate

        return evaluate(fmt.removeprefix("jsonpath="), data)
    if fmt == "name":
        found = name(data) if name else name_of(data)
        if not found:
            raise CliError("-o name: this answer names nothing; use -o json or -o yaml")
        return found
    return json.dumps(data, indent=2, sort_keys=True)


_NAME_KEYS = ("job_id", "pod_id", "name", "id", "tenant", "principal")


def name_of(data: Any) -> str:
    """The id of one answer (`-o name`): its job_id, pod_id, name, ..., or that of the one
    object it wraps (`{"job": {...}}`, `registration`)."""
    if not isinstance(data, dict):
        return ""
    for key in _NAME_KEYS:
        if isinstance(data.get(key), str) and data[key]:
            return str(data[key])
    for value in data.values():
        if isinstance(value, dict):
            found = name_of(value)
            if found:
                return found
    return ""


def sort_items(items: Sequence[Any], path: str) -> list[Any]:
    """`items` ordered by the field `path` of their JSON (`--sort-by`); numbers as numbers,
    items without it first."""
    from lightpath.cli.jsonpath import JsonPathError, values

    expr = path.strip().removeprefix("{").removesuffix("}")
    if not expr.startswith((".", "$", "[")):
        expr = "." + expr

    def key(item: Any) -> tuple:
        try:
            found = values(expr, to_jsonable(item))
        except JsonPathError as exc:
            raise CliError(f"--sort-by {path}: {exc}") from None
        if not found or found[0] is None:
            return (0, 0, "")
        v = found[0]
        if isinstance(v, bool | int | float):
            return (1, float(v), "")
        return (2, 0, json.dumps(v, sort_keys=True) if not isinstance(v, str) else v)

    return sorted(items, key=key)


def age(seconds: float) -> str:
    """kubectl's AGE: 42s, 5m, 3h, 2d (1m30s under 10 minutes, 3h5m under 10 hours)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 10:
        return f"{m}m{s}s" if s else f"{m}m"
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 10:
        return f"{h}h{m}m" if m else f"{h}h"
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


def age_of(timestamp: Any, now: float | None = None) -> str:
    """The AGE of a protobuf Timestamp field ("-" when unset)."""
    import time

    if not getattr(timestamp, "seconds", 0):
        return "-"
    now = time.time() if now is None else now
    return age(now - (timestamp.seconds + timestamp.nanos / 1e9))


def to_jsonable(value: Any) -> Any:
    """A protobuf message as JSON data with every field (zeros and empty lists too), the
    proto's field names, int64 as numbers; dicts and lists of them likewise."""
    if isinstance(value, Message):
        return json_format.MessageToDict(
            value,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
            unquote_int64_if_possible=True,
        )
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """The answer in the command's structured output format (json, yaml, name, jsonpath)."""
    fmt = OUTPUT.format if structured(OUTPUT.format) else "json"
    print(render(to_jsonable(value), fmt))


def print_json_line(value: Any) -> None:
    """One compact JSON object on one line, flushed (streams: `watch --json`)."""
    print(json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":")), flush=True)


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./()+,=-]*(?: [A-Za-z0-9_./()+,=-]+)*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"}


def _yaml_string(text: str) -> str:
    """A key or string value plain when YAML reads it back as that string, else quoted
    as JSON (which YAML reads)."""
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)


def to_yaml(value: Any, indent: int = 0) -> str:
    """JSON data as block-style YAML: keys and strings plain where YAML reads them back
    as the same string (`state: JOB_STATE_RUNNING`), quoted as JSON otherwise."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}"
        lines = []
        for k in sorted(value):
            v = value[k]
            key = _yaml_string(str(k))
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{key}:\n{to_yaml(v, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {to_yaml(v).strip()}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return pad + "[]"
        lines = []
        for v in value:
            if isinstance(v, (dict, list)) and v:
                inner = to_yaml(v, indent + 2)
                lines.append(f"{pad}- {inner.lstrip()}")
            else:
                lines.append(f"{pad}- {to_yaml(v).strip()}")
        return "\n".join(lines)
    if isinstance(value, str):
        return pad + _yaml_string(value)
    return pad + json.dumps(value)


def clip(text: str, width: int) -> str:
    """`text` cut to `width` characters, with an ellipsis when it was longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def table(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], *, show_headers: bool = True
) -> str:
    cells = [list(map(str, headers)), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if not show_headers:
        return "\n".join(lines[1:])
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_list(
    args: argparse.Namespace,
    key: str,
    items: Sequence[Any],
    columns: Callable[[bool], tuple[list[str], list[Sequence[Any]]]],
    name: Callable[[Any], str],
    *,
    next_page_token: str = "",
    data: Any = None,
) -> None:
    """A list answer in the command's output format: `{key: [...], "next_page_token"}`
    (or `data`, when the command's JSON has another shape) as JSON/YAML; a table
    (`columns(wide)` gives headers and rows); or names. A page with more after it says
    so on stderr, with the flags that fetch the rest."""
    fmt = output_format(args)
    if getattr(args, "sort_by", None):
        items = sort_items(items, args.sort_by)
        if data is not None and isinstance(data, dict) and key in data:
            data = {**data, key: items}
    if fmt in ("json", "yaml") or fmt.startswith("jsonpath="):
        if data is None:
            data = {key: list(items), "next_page_token": next_page_token}
        data = to_jsonable(data)
        print(
            json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
            if fmt == "json"
            else render(data, fmt)
        )
    elif fmt == "name":
        for item in items:
            print(name(item))
    else:
        headers, rows = columns(fmt == "wide")
        if rows or not args.no_headers:
            print(table(rows, headers, show_headers=not args.no_headers))
    if next_page_token and fmt in ("table", "wide", "name"):
        print(
            f"more {key}: --all lists every one, --page-token {next_page_token} the next page",
            file=sys.stderr,
        )


def run_rpc(
    fn: Callable[[], Coroutine[Any, Any, int | None]],
    *,
    hints: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> int:
    """Run an async CLI action; a failed call becomes a readable message (with what to do
    next, and `hints[code]` when the command has one for that status code) on stderr and
    exit code 1; a credential the CLI cannot find, exit code 2. `flags` names the
    command-line flag that sets a request field ({"spec.twisted": "--twisted"}): a field
    violation of that field (or one under it) names the flag too."""
    try:
        return int(asyncio.run(fn()) or 0)
    except (grpc.aio.AioRpcError, LightpathError) as err:
        exc = rpc_error(err) if isinstance(err, grpc.aio.AioRpcError) else err
        report_error(exc, [hints[exc.code]] if hints and exc.code in hints else [], flags)
        return 1
    except CredentialsError as exc:
        report_credentials_error(exc)
        return 2


def report_credentials_error(exc: Exception) -> None:
    print_error("CREDENTIALS", str(exc))


def print_error(code: str, message: str, **more: Any) -> None:
    """`error: message` on stderr; with JSON output one object `{"error": {...}}`."""
    from lightpath.cli.tracing import trace_id

    if OUTPUT.json:
        body = {"code": code, "message": message, **more, "trace_id": trace_id()}
        print(json.dumps({"error": body}, sort_keys=True), file=sys.stderr)
    else:
        print(f"error: {message}", file=sys.stderr)


def flag_of(field: str, flags: Mapping[str, str] | None) -> str:
    """The flag that sets `field` or the field it is under ("spec.shape.dims[0]" is set
    by --shape), "" when the command has none for it."""
    for name, flag in (flags or {}).items():
        if field == name or field.startswith((name + ".", name + "[")):
            return flag
    return ""


def report_error(
    exc: LightpathError, hints: Sequence[str] = (), flags: Mapping[str, str] | None = None
) -> None:
    """`error: CODE: message`, the field violations, then `next: ...` lines (the command's
    own `hints` first); with JSON output the same as one JSON object on stderr. A field a
    flag of the command sets is named with it: `--twisted (spec.twisted): ...`."""
    from lightpath.cli.tracing import print_trace_id

    steps = [*hints, *next_steps(exc)]
    if OUTPUT.json:
        print_error(
            exc.code,
            exc.message,
            reason=exc.reason,
            field_violations=[
                {"field": v.field, "description": v.rule}
                | ({"flag": flag} if (flag := flag_of(v.field, flags)) else {})
                for v in exc.violations
            ],
            precondition_violations=[
                {"subject": v.field, "description": v.rule} for v in exc.precondition_violations
            ],
            retry_delay_s=exc.retry_delay_s,
            metadata=exc.metadata,
            address=exc.address,
            next=steps,
        )
        return
    message = exc.message
    named = {
        v.field: f"{flag} ({v.field})" for v in exc.violations if (flag := flag_of(v.field, flags))
    }
    for field, with_flag in named.items():
        message = message.replace(f"{field}: ", f"{with_flag}: ")
    print(f"error: {exc.code}: {message}", file=sys.stderr)
    for v in exc.violations:
        if f"{v.field}: {v.rule}" not in exc.message:
            print(f"  {named.get(v.field, v.field)}: {v.rule}", file=sys.stderr)
    for v in exc.precondition_violations:
        if v.rule not in exc.message:
            print(f"  {v.field}: {v.rule}", file=sys.stderr)
    for line in steps:
        print(f"next: {line}", file=sys.stderr)
    print_trace_id()


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
    if creds.source.startswith("context "):
        who = presented_principal(creds)
        return f"the credentials of {creds.source}" + (f" ({who})" if who else "")
    if creds.source.startswith("local"):
        who = presented_principal(creds) or creds.source.removeprefix("local ")
        return f"the local stack's certificate of {who}, in {pki_dir()}"
    return f"LIGHTPATH_TLS_* are unset and {pki_dir()} has no local stack's certificates"


def next_steps(exc: LightpathError) -> list[str]:
    """What a person can do about a failed call, in the CLI's words."""
    code = grpc.StatusCode[exc.code] if exc.code in grpc.StatusCode.__members__ else None
    message, reason, metadata = exc.message, exc.reason, exc.metadata
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
                return [
                    "call it as a core broker application: an operator registers one and "
                    "gets its token (`lightpath cores add-app NAME`, or `export "
                    "LIGHTPATH_CB_TOKEN=$(lightpath -o jsonpath='{.token}' cores add-app "
                    "NAME)`); then $LIGHTPATH_CB_TOKEN or `--token` carries it"
                ]
            return []
        if reason == "TENANT_MISMATCH":
            return [
                "a tenant's credential acts only for its own tenant: leave --tenant out, "
                "or use `--as <that tenant>`"
            ]
        return []
    if code == grpc.StatusCode.UNAVAILABLE:
        return _unavailable_steps(message, creds, exc)
    if code == grpc.StatusCode.NOT_FOUND:
        who = presented_principal(creds)
        if who.startswith("tenant:") and not (creds and creds.token):
            return [
                f"as {who} you see only what belongs to tenant {who.partition(':')[2]}; "
                "an operator (`--as operator`) sees everything"
            ]
    return []


def _unavailable_steps(message: str, creds: Credentials | None, exc: LightpathError) -> list[str]:
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
    # gRPC words a peer that hangs up before any TLS as "Socket closed" or, when the
    # close races its first handshake read (a loaded machine), "Handshake read failed".
    closed = "socket closed" in text or "handshake read failed" in text
    if closed and exc.address and not speaks_tls(exc.address):
        # A published port whose service has not started listening (a container's port
        # forwarder accepts, then closes): not a certificate problem at all.
        what = {"cell-scheduler": "cell"}.get(exc.process, exc.process or "service")
        return [
            f"the {what} is not serving yet: something accepts connections at {exc.address} "
            "but closes them before any TLS (a service still starting behind a published "
            "port, e.g. a compose stack coming up)",
            "wait until it is healthy (`docker compose ps`, `lightpath status`) and try again",
        ]
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
        tried = f"nothing answers at {exc.address}" if exc.address else "nothing answers"
        if exc.address_source:
            tried += f", taken from {exc.address_source}"
        return [
            tried,
            "start a local stack with `lightpath up` (`lightpath status` shows it), "
            "or give the address of a running service",
        ]
    return []


def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Whether whatever listens at `address` (host:port) answers a TLS ClientHello at
    all, whatever it then thinks of the certificates: False when it accepts the
    connection and closes it (or refuses, or stays silent) before sending a byte of TLS."""
    import socket
    import ssl

    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a probe: only whether TLS is spoken
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
            with context.wrap_socket(raw) as tls:
                tls.do_handshake()
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, OSError, ValueError) as exc:
        # a TLS alert (the server rejected this probe) is an SSLError, i.e. TLS spoken
        return isinstance(exc, ssl.SSLError) and not isinstance(
            exc, ssl.SSLEOFError | ssl.SSLZeroReturnError
        )
    return True


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
    with environ_restored((*_SET_ASIDE_BY_AS, "LIGHTPATH_IDENTITY")):
        for k in _SET_ASIDE_BY_AS:
            os.environ.pop(k, None)
        os.environ["LIGHTPATH_IDENTITY"] = identity
        yield


@contextlib.contextmanager
def environ_restored(keys: Sequence[str]) -> Iterator[None]:
    """The environment variables `keys` as they were before the block, after it (the CLI
    runs in-process in tests and scripts: a command's settings must not outlive it)."""
    saved = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
