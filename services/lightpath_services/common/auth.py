"""Who is calling, and may they (issue: security). One mechanism for all five services.

The server factory's interceptor asks the service's `Guard` before every call:

1. the method's row in `lightpath_services.common.policy` (no row: refused);
2. the caller's principal (`authenticate`): a bearer token in the
   `authorization` metadata if one is sent (verified by the token verifiers:
   Lightpath's token registry in Redis, then any the service adds, such as
   core_broker's application credentials), else the `spiffe://lightpath/...`
   URI of the client certificate the TLS handshake verified. The peer identity
   in the TLS auth context is the source of truth; nothing in a request body
   names the caller. This is also the seam for other identity providers
   (OIDC, Kubernetes TokenReview): a `TokenVerifier` that answers for their tokens;
3. the role (`authorize`), and for `same_scope` rows the caller's pod/switch.

Then the servicer runs with `caller()` set to the principal, for its own
per-resource checks (helpers below). Every mutating call and every denied call
is written to the audit log with its outcome.

Every refusal (the Guard's, and a servicer's own per-resource checks) is counted
in lightpath.auth.failures by reason (`count_failure`, called by the server
interceptor, which sees them all).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import grpc

from lightpath import __version__
from lightpath.errors import PermissionDenied, Unauthenticated
from lightpath.security.identity import OPERATOR, SERVICE, TENANT, Principal, from_uri
from lightpath_services.common import instruments
from lightpath_services.common.audit import AuditLog
from lightpath_services.common.policy import UNSCOPED_ROLES, Rule, rule_for

_CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "lightpath_caller", default=None
)
METADATA_KEY = "authorization"

_failures = instruments.get_meter("lightpath.auth", __version__).create_counter(
    "lightpath.auth.failures",
    description="calls refused as UNAUTHENTICATED or PERMISSION_DENIED, by reason",
)
_REASONS: dict[str, dict[str, str]] = {}


def count_failure(reason: str) -> None:
    """Count one refused call (UNAUTHENTICATED or PERMISSION_DENIED) under `reason`
    (MISSING_CREDENTIAL, INVALID_CREDENTIAL, ROLE_REQUIRED, WRONG_SCOPE, ...)."""
    attrs = _REASONS.get(reason)
    if attrs is None:
        attrs = {"reason": reason}
        if len(_REASONS) < 256:
            _REASONS[reason] = attrs
    _failures.add(1, attrs)


_PEER_CACHE_LIMIT = 4096


class TokenVerifier(Protocol):
    async def verify(self, token: str) -> Principal | None: ...


def caller() -> Principal | None:
    """The principal of the call being served (None outside a call, or for public methods)."""
    return _CALLER.get()


def bearer_token(metadata: Iterable[Any] | None) -> str | None:
    """The token of `authorization: Bearer <token>`; None when absent; UNAUTHENTICATED when malformed."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            raise Unauthenticated(
                "the authorization metadata must be `Bearer <token>`",
                reason="MALFORMED_CREDENTIAL",
            )
    return None


def role_of(principal: Principal) -> set[str]:
    if principal.kind == SERVICE:
        return {f"service:{principal.name.split('/')[0]}"}
    return {principal.kind}


class Guard:
    """Authentication, authorization and audit for one service process."""

    def __init__(
        self,
        service: str,
        *,
        scope: str = "",
        verifiers: Sequence[TokenVerifier] = (),
        audit: AuditLog | None = None,
    ):
        self.service = service
        self.scope = scope
        self.verifiers = list(verifiers)
        self.audit = audit
        self._peers: dict[bytes, Principal | None] = {}

    def add_verifier(self, verifier: TokenVerifier) -> None:
        self.verifiers.append(verifier)

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Principal:
        token = bearer_token(context.invocation_metadata())
        if token is not None:
            for verifier in self.verifiers:
                principal = await verifier.verify(token)
                if principal is not None:
                    return principal
            raise Unauthenticated(
                "invalid credential: the bearer token is unknown, revoked or malformed",
                reason="INVALID_CREDENTIAL",
            )
        auth = context.auth_context()
        ids = auth.get("peer_spiffe_id")
        if ids:
            principal = self._peer(ids[0])
            if principal is not None:
                return principal
            raise Unauthenticated(
                f"the client certificate names {ids[0].decode(errors='replace')!r}, which is not a "
                "Lightpath identity: expected spiffe://lightpath/<kind>/<name>",
                reason="UNKNOWN_IDENTITY",
            )
        if auth.get("x509_common_name"):
            raise Unauthenticated(
                "the client certificate carries no spiffe://lightpath/<kind>/<name> URI: "
                "issue it with the caller's identity (docs/security.md)",
                reason="UNKNOWN_IDENTITY",
            )
        raise Unauthenticated(
            "missing credential: present a client certificate issued by the cell's CA "
            "(spiffe://lightpath/<kind>/<name>) or send `authorization: Bearer <token>` metadata",
            reason="MISSING_CREDENTIAL",
        )

    def _peer(self, raw: bytes) -> Principal | None:
        if raw in self._peers:
            return self._peers[raw]
        principal = from_uri(raw.decode(errors="replace"))
        if len(self._peers) >= _PEER_CACHE_LIMIT:
            self._peers.clear()
        self._peers[raw] = principal
        return principal

    def authorize(self, method: str, rule: Rule, principal: Principal) -> None:
        if not (role_of(principal) & rule.roles):
            raise PermissionDenied(
                f"{principal} may not call {method.rsplit('/', 1)[-1]}: "
                f"it needs the role {rule.describe_roles()}",
                reason="ROLE_REQUIRED",
                metadata={"principal": str(principal), "roles": rule.describe_roles()},
            )
        if (
            rule.same_scope
            and principal.kind == SERVICE
            and principal.scope() != self.scope
            and not role_of(principal) & UNSCOPED_ROLES
        ):
            raise PermissionDenied(
                f"{principal} serves {principal.scope() or 'no pod'}, this {self.service} serves "
                f"{self.scope}: only its own {principal.name.split('/')[0]} may call "
                f"{method.rsplit('/', 1)[-1]}",
                reason="WRONG_SCOPE",
                metadata={"principal": str(principal), "scope": self.scope},
            )

    def rule(self, method: str) -> Rule:
        """The method's row of the policy; a method without one is refused."""
        rule = rule_for(method)
        if rule is None:
            raise PermissionDenied(
                f"{method} has no authorization rule, so nobody may call it",
                reason="NO_AUTHORIZATION_RULE",
            )
        return rule

    def bind(self, principal: Principal | None) -> contextvars.Token:
        return _CALLER.set(principal)

    def unbind(self, token: contextvars.Token) -> None:
        _CALLER.reset(token)


# -- per-resource checks the servicers make -----------------------------------


def tenant_scope() -> str | None:
    """The tenant a caller is confined to; None for operators and services (all tenants)."""
    principal = caller()
    if principal is not None and principal.kind == TENANT:
        return principal.name
    return None


def require_tenant_field(value: str, field: str = "tenant") -> str:
    """The tenant a request acts for: a tenant's own name (the field empty or the same),
    or, for operators and services, the field as given. A tenant naming another is refused."""
    own = tenant_scope()
    if own is None:
        return value
    if value and value != own:
        raise PermissionDenied(
            f"{field} {value!r} is not yours: this credential acts for tenant {own!r}",
            reason="TENANT_MISMATCH",
            metadata={"principal": f"tenant:{own}", "field": field},
        )
    return own


def require_service_scope(service: str, scope: str, what: str) -> None:
    """A `service` caller may act only for its own scope (pod or switch); operators for any."""
    principal = caller()
    if principal is None or principal.kind == OPERATOR:
        return
    if principal.is_service(service) and principal.scope() != scope:
        raise PermissionDenied(
            f"{principal} may not act for {what} {scope!r}: only for {principal.scope()!r}",
            reason="NOT_OWN_SCOPE",
            metadata={"principal": str(principal)},
        )
