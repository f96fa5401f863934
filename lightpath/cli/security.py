"""Who may call: credentials of the local stack.

    lightpath tenant create acme [--token]     # acme's certificate (+ a bearer token)
    lightpath tenant list
    lightpath token create tenant:beta         # a bearer token, shown once
    lightpath token list | revoke TOKEN_ID
    lightpath whoami                           # what a command presents

Certificates come from the local CA in `<state dir>/pki` (made by `lightpath up`);
tokens live in the running stack's Redis, so `token` and `tenant create --token`
need the stack up. Issuing and revoking is itself written to the audit log
(`<state dir>/audit/lightpath-cli.jsonl`; `lightpath audit` reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import getpass
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lightpath.cli._common import (
    CliError,
    add_json_flag,
    add_list_output,
    describe_credentials,
    output_format,
    presented_principal,
    print_json,
    print_list,
)
from lightpath.paths import default_state_dir, pki_dir, write_private
from lightpath.security.credentials import identity_of, token_path
from lightpath.security.identity import TENANT, IdentityError, Principal

if TYPE_CHECKING:
    from lightpath.security.pki import LocalCA

T = TypeVar("T")
CLI_AUDIT_FILE = "lightpath-cli.jsonl"


def register(sub: argparse._SubParsersAction) -> None:
    tenant = sub.add_parser("tenant", help="tenants' credentials on the local stack")
    verbs = tenant.add_subparsers(dest="tenant_command", metavar="ACTION")
    verbs.required = True
    p = verbs.add_parser(
        "create", help="issue a tenant's certificate from the local CA (and a token with --token)"
    )
    p.add_argument("name", help="the tenant, e.g. acme")
    p.add_argument(
        "--token",
        action="store_true",
        help="also a bearer token, registered in the running stack's Redis and shown once",
    )
    p.add_argument("--renew", action="store_true", help="a new certificate even if one is valid")
    state_dir_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_tenant_create)
    p = verbs.add_parser("list", help="tenants with a certificate or a token")
    state_dir_flag(p)
    add_list_output(p)
    p.set_defaults(func=cmd_tenant_list)

    token = sub.add_parser("token", help="bearer tokens of the local stack (in its Redis)")
    verbs = token.add_subparsers(dest="token_command", metavar="ACTION")
    verbs.required = True
    p = verbs.add_parser("create", help="issue a token for KIND:NAME (shown once)")
    p.add_argument(
        "principal", help="kind:name, e.g. tenant:beta or operator:alice (acme = tenant)"
    )
    p.add_argument("--file", type=Path, help="also write it to FILE (0600)")
    state_dir_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_token_create)
    p = verbs.add_parser("list", help="token ids and whom they were issued to (never the secret)")
    p.add_argument("--principal", help="only this kind:name")
    state_dir_flag(p)
    add_list_output(p)
    p.set_defaults(func=cmd_token_list)
    p = verbs.add_parser("revoke", help="revoke a token by its id (or the token itself)")
    p.add_argument("token_id", help="the token's id (`lightpath token list`), or the token")
    state_dir_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_token_revoke)

    p = sub.add_parser("whoami", help="the credential a command presents, and where it came from")
    add_json_flag(p)
    p.set_defaults(func=cmd_whoami)


def state_dir_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        type=Path,
        help="the local stack's directory (default $LIGHTPATH_STATE_DIR or .lightpath)",
    )


def state_dir_of(args: argparse.Namespace) -> Path:
    return Path(args.state_dir).resolve() if args.state_dir else default_state_dir()


# -- the local CA and the stack's Redis -----------------------------------------


def _local_ca(state_dir: Path) -> LocalCA:
    # pki (cryptography's x509) when a command uses the CA, not for every command
    from lightpath.security.pki import LocalCA

    ca = LocalCA(pki_dir(state_dir))
    if not ca.exists():
        raise CliError(
            f"no local CA in {ca.dir}: start the stack with `lightpath up` (it makes the CA), "
            "or point --state-dir / LIGHTPATH_STATE_DIR at the stack's directory"
        )
    return ca


def _with_registry(state_dir: Path, action: Callable[[Any], Awaitable[T]]) -> T:
    """Run `action(TokenRegistry)` against the running stack's Redis."""
    import redis.exceptions

    from lightpath.security.tokens import TokenRegistry
    from lightpath.stack import local_redis, running_stack

    stack = running_stack(state_dir)
    if stack is None:
        raise CliError(
            f"no stack running from {state_dir}: tokens live in the stack's Redis; "
            "start the stack with `lightpath up` (or point --state-dir at its directory)"
        )

    async def run() -> T:
        client = local_redis(stack.redis_url, stack.redis_password_file)
        try:
            return await action(TokenRegistry(client, cache_s=0))
        finally:
            await client.aclose()

    try:
        return asyncio.run(run())
    except (redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError) as exc:
        raise CliError(f"cannot reach the stack's Redis at {stack.redis_url}: {exc}") from None
    except OSError as exc:
        raise CliError(
            f"cannot read the Redis password {stack.redis_password_file}: {exc}"
        ) from None


def _iso(seconds: float) -> str:
    return (
        dt.datetime.fromtimestamp(seconds, dt.UTC)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z")
    )


def _record(state_dir: Path, method: str, resources: dict[str, Any]) -> None:
    """An audit line for what the CLI did itself (issuing, revoking), beside the services'."""
    now = time.time()
    entry = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z",
        "service": "lightpath_cli",
        "instance": "cli",
        "method": f"/lightpath.cli/{method}",
        "principal": "operator:operator",
        "resources": resources,
        "code": "OK",
        "trace_id": "",
        "level": "Metadata",
        "user": _user(),
    }
    path = state_dir / "audit" / CLI_AUDIT_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError as exc:
        print(f"warning: cannot write the audit log {path}: {exc.strerror}", file=sys.stderr)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _cert_not_after(path: Path) -> dt.datetime | None:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None


def _cert_principal(path: Path) -> Principal | None:
    """The `spiffe://lightpath/...` principal a certificate file names."""
    from lightpath.security.credentials import Credentials

    try:
        who = presented_principal(Credentials(cert=path.read_bytes(), tls=True))
    except OSError:
        return None
    return Principal.parse(who) if who else None


def _token_id(token: str) -> str:
    """The id part of `lpt1.<id>.<secret>` ('' for anything else)."""
    parts = token.strip().split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "lpt1" else ""


# -- tenant ------------------------------------------------------------------------


def cmd_tenant_create(args: argparse.Namespace) -> int:
    from lightpath.stack import running_stack

    try:
        principal = Principal(TENANT, args.name)
    except IdentityError as exc:
        raise CliError(f"tenant {args.name!r}: {exc}", code=2) from None
    state_dir = state_dir_of(args)
    ca = _local_ca(state_dir)
    stack = running_stack(state_dir)
    want_token = args.token or (stack is not None and not stack.tls)  # plaintext: tokens only
    if want_token and stack is None:
        raise CliError(
            f"no stack running from {state_dir}: a token is registered in the stack's Redis; "
            "start the stack with `lightpath up`, or leave --token out for the certificate alone"
        )
    files = ca.paths(principal)
    before = files.cert.stat().st_mtime_ns if files.cert.exists() else None
    files = ca.issue(principal, force=args.renew)
    issued = before is None or files.cert.stat().st_mtime_ns != before
    not_after = _cert_not_after(files.cert)
    out: dict[str, Any] = {
        "principal": str(principal),
        "certificate": str(files.cert),
        "key": str(files.key),
        "ca": str(files.ca),
        "not_after": not_after.isoformat().replace("+00:00", "Z") if not_after else None,
        "issued": issued,
    }
    if want_token:
        path = token_path(state_dir, principal)
        try:
            previous = _token_id(path.read_text())
        except OSError:
            previous = ""
        token_id, token = _with_registry(state_dir, lambda reg: reg.issue(principal))
        write_private(path, token + "\n")
        out.update(token_id=token_id, token=token, token_file=str(path))
        if previous:
            out["previous_token_id"] = previous
        _record(state_dir, "CreateToken", {"principal": str(principal), "token_id": token_id})
    if issued:
        _record(state_dir, "CreateTenant", {"tenant": principal.name})
    if args.json:
        print_json(out)
        return 0
    name = principal.name
    if issued:
        print(f"tenant {name}: certificate issued by the local CA, valid until {out['not_after']}")
    else:
        print(
            f"tenant {name}: already has a valid certificate (until {out['not_after']}); "
            "kept (--renew issues a new one)"
        )
    print(f"  certificate {files.cert}\n  key         {files.key}\n  CA          {files.ca}")
    print(f"act as it:   lightpath --as {name} jobs")
    print(
        f"elsewhere:   LIGHTPATH_TLS_CA={files.ca} LIGHTPATH_TLS_CERT={files.cert} "
        f"LIGHTPATH_TLS_KEY={files.key}"
    )
    if "token" in out:
        print(
            f"\nbearer token {out['token_id']} (saved 0600 in {out['token_file']}; "
            "the stack keeps only its hash):"
        )
        print(out["token"])
        print(f"use it:      LIGHTPATH_TOKEN_FILE={out['token_file']} lightpath jobs")
        if previous:
            print(
                f"the previous token {previous} stays valid until "
                f"`lightpath token revoke {previous}`"
            )
    return 0


def cmd_tenant_list(args: argparse.Namespace) -> int:
    from lightpath.security.pki import LocalCA
    from lightpath.stack import running_stack

    state_dir = state_dir_of(args)
    ca = LocalCA(pki_dir(state_dir))
    tenants: dict[str, dict[str, Any]] = {}
    prefix = f"{TENANT}-"
    if ca.dir.is_dir():
        for cert in sorted(ca.dir.glob(f"{prefix}*.crt")):
            who = _cert_principal(cert)
            if who is None or who.kind != TENANT:
                continue
            name = who.name
            not_after = _cert_not_after(cert)
            tenants[name] = {
                "tenant": name,
                "certificate": str(cert),
                "not_after": not_after.isoformat().replace("+00:00", "Z") if not_after else None,
                "tokens": [],
            }
    tokens_known = running_stack(state_dir) is not None
    if tokens_known:
        for rec in _with_registry(state_dir, lambda reg: reg.list()):
            kind, _, name = rec["principal"].partition(":")
            if kind != TENANT:
                continue
            entry = tenants.setdefault(
                name, {"tenant": name, "certificate": None, "not_after": None, "tokens": []}
            )
            entry["tokens"].append({"token_id": rec["token_id"], "created": _iso(rec["created"])})
    rows = sorted(tenants.values(), key=lambda t: t["tenant"])
    if not rows and output_format(args) in ("table", "wide"):
        print("no tenants yet: `lightpath tenant create NAME` issues one's credential")
    else:
        print_list(
            args,
            "tenants",
            rows,
            lambda wide: (
                ["tenant", "certificate", "tokens"],
                [
                    (
                        t["tenant"],
                        f"valid until {t['not_after']}" if t["certificate"] else "-",
                        " ".join(k["token_id"] for k in t["tokens"])
                        or ("-" if tokens_known else "?"),
                    )
                    for t in rows
                ],
            ),
            lambda t: t["tenant"],
            data={"tenants": rows, "tokens_known": tokens_known},
        )
    if not tokens_known:
        print("(tokens not shown: no stack running; they live in its Redis)", file=sys.stderr)
    return 0


# -- token ------------------------------------------------------------------------


def cmd_token_create(args: argparse.Namespace) -> int:
    try:
        principal = identity_of(args.principal)
    except IdentityError as exc:
        raise CliError(f"{args.principal!r}: {exc}", code=2) from None
    state_dir = state_dir_of(args)
    token_id, token = _with_registry(state_dir, lambda reg: reg.issue(principal))
    if args.file:
        write_private(args.file, token + "\n")
    _record(state_dir, "CreateToken", {"principal": str(principal), "token_id": token_id})
    if args.json:
        out = {"principal": str(principal), "token_id": token_id, "token": token}
        if args.file:
            out["token_file"] = str(args.file)
        print_json(out)
        return 0
    print(f"token {token_id} for {principal} (shown once; keep it secret):")
    print(token)
    where = f"LIGHTPATH_TOKEN_FILE={args.file}" if args.file else "LIGHTPATH_TOKEN=<the token>"
    print(f"use it:    {where} lightpath jobs   (it names the caller, certificate or not)")
    print(f"revoke it: lightpath token revoke {token_id}")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    records = _with_registry(state_dir, lambda reg: reg.list())
    if args.principal:
        try:
            wanted = str(identity_of(args.principal))
        except IdentityError as exc:
            raise CliError(f"--principal {args.principal!r}: {exc}", code=2) from None
        records = [r for r in records if r["principal"] == wanted]
    rows = [{**r, "created": _iso(r["created"])} for r in records]
    if not rows and output_format(args) in ("table", "wide"):
        print("no tokens: `lightpath token create KIND:NAME` issues one")
        return 0
    print_list(
        args,
        "tokens",
        rows,
        lambda wide: (
            ["token", "principal", "created"],
            [(r["token_id"], r["principal"], r["created"]) for r in rows],
        ),
        lambda r: r["token_id"],
        data=rows,
    )
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    state_dir = state_dir_of(args)
    token_id = _token_id(args.token_id) or args.token_id.strip()
    revoked = _with_registry(state_dir, lambda reg: reg.revoke(token_id))
    if revoked:
        _record(state_dir, "RevokeToken", {"token_id": token_id})
    if args.json:
        print_json({"token_id": token_id, "revoked": revoked})
        return 0 if revoked else 1
    if not revoked:
        raise CliError(
            f"no token {token_id} in the stack's Redis (`lightpath token list` shows them)"
        )
    print(f"token {token_id} revoked: services refuse it within a few seconds (they cache for 2 s)")
    return 0


# -- whoami -----------------------------------------------------------------------


def cmd_whoami(args: argparse.Namespace) -> int:
    from lightpath.security.credentials import Credentials

    creds = Credentials.default()
    principal = presented_principal(creds)
    token_id = _token_id(creds.token) if creds.token else ""
    token_principal = _token_principal(token_id) if token_id else None
    seen_as = token_principal if creds.token else principal
    out = {
        "source": creds.source,
        "tls": creds.tls,
        "certificate_principal": principal or None,
        "token": bool(creds.token),
        "token_id": token_id or None,
        "token_principal": token_principal,
        "principal": seen_as or None,
    }
    if args.json:
        print_json(out)
        return 0
    if principal:
        print(f"certificate: {principal}\n  from       {describe_credentials(creds)}")
    else:
        print(f"certificate: none{'' if creds.tls else ', no TLS'} ({describe_credentials(creds)})")
    if creds.token:
        issued = f", issued to {token_principal}" if token_principal else ""
        print(f"token:       {token_id or 'not a Lightpath token'}{issued}")
    if seen_as:
        print(f"services see you as {seen_as}")
    elif creds.token:
        print("services see you as whoever the token was issued to, if they know it")
    else:
        print(
            "services will refuse your calls as UNAUTHENTICATED: start the local stack with "
            "`lightpath up`, or set LIGHTPATH_TLS_* / LIGHTPATH_TOKEN_FILE"
        )
    return 0


def _token_principal(token_id: str) -> str | None:
    """Whom the local stack issued a token id to (None: no stack running, or not its token)."""
    from lightpath.stack import running_stack

    if running_stack() is None:
        return None
    try:
        records = _with_registry(default_state_dir(), lambda reg: reg.list())
    except CliError:
        return None
    return next((r["principal"] for r in records if r["token_id"] == token_id), None)
