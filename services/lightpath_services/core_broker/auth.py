"""Who is calling (CB-2, seed 001 ¶21, ¶38, ¶52-53), through the one mechanism
every service uses (lightpath_services.common.auth).

The `Guard` authenticates every call: a bearer token when one is sent, else the
client certificate. This module is the broker's part of it:

* `Authenticator` is a `TokenVerifier` the broker adds to its Guard. An
  application's token is `<application_id>:<secret>`; the broker keeps only a
  salted SHA-256 of the secret (the secret is 256 random bits, so a fast hash
  is the right one), and trusts a verified token for `cache_s` seconds without
  asking Redis again (a removed or rotated credential stops working on every
  replica within that time). The operator's token (LIGHTPATH_CB_OPERATOR_TOKEN),
  when set, names the operator.
* `Authenticator.principal` turns the Guard's caller into the broker's own
  `Principal`: an operator (a certificate `spiffe://lightpath/operator/<name>`,
  the operator token, or a Lightpath token issued to an operator), or an
  application with the QoS level and billing model it agreed to (its token, a
  certificate `spiffe://lightpath/application/<id>`, or a Lightpath token issued
  to `application:<id>`). An application the broker does not know (never
  registered, or removed) is UNAUTHENTICATED, whatever credential it shows.

Which kinds may call which method is the `_BROKER` table of
lightpath_services.common.policy; the per-reservation checks (an application touches only
its own) are the broker's.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

from lightpath.errors import PermissionDenied, Unauthenticated
from lightpath.security import identity
from lightpath_services.common.keys import is_valid_id
from lightpath_services.core_broker.store import BrokerStore, verify_secret

_CACHE_LIMIT = 10_000


@dataclass(frozen=True)
class Principal:
    """An application (with its agreed QoS level and billing model), or the operator."""

    application_id: str | None
    qos_level: str = ""
    billing_model: str = ""

    @property
    def is_operator(self) -> bool:
        return self.application_id is None

    @property
    def name(self) -> str:
        return "operator" if self.application_id is None else self.application_id


OPERATOR = Principal(None)
OPERATOR_IDENTITY = identity.Principal(identity.OPERATOR, identity.OPERATOR)


class Authenticator:
    """The broker's token verifier (`lightpath_services.common.auth.TokenVerifier`) and the
    map from the Guard's caller to the broker's `Principal`."""

    def __init__(
        self,
        store: BrokerStore,
        operator_token: str,
        cache_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._store = store
        self._operator = operator_token.encode()
        self._cache_s = cache_s
        self._clock = clock
        # token -> (application id, until): a verified application token
        self._tokens: dict[str, tuple[str, float]] = {}
        # application id -> (its Principal, until): its agreement as last read
        self._apps: dict[str, tuple[Principal, float]] = {}

    async def verify(self, token: str) -> identity.Principal | None:
        """The principal of an operator or application token; None for any other token
        (the Guard then asks its other verifiers, or answers INVALID_CREDENTIAL)."""
        if self._operator and hmac.compare_digest(token.encode(), self._operator):
            return OPERATOR_IDENTITY
        now = self._clock()
        hit = self._tokens.get(token)
        if hit is not None and hit[1] > now:
            return identity.Principal(identity.APPLICATION, hit[0])
        app_id, sep, secret = token.partition(":")
        if not sep or not secret or not is_valid_id(app_id):
            return None
        app = await self._store.application(app_id)
        if app is None or not verify_secret(app, secret):
            return None
        principal = Principal(app_id, app.qos_level, app.billing_model)
        if self._cache_s > 0:
            until = now + self._cache_s
            _put(self._tokens, token, (app_id, until))
            _put(self._apps, app_id, (principal, until))
        return identity.Principal(identity.APPLICATION, app_id)

    async def principal(self, caller: identity.Principal | None) -> Principal:
        """The broker's principal of the caller the Guard authenticated."""
        if caller is None:
            raise Unauthenticated(
                "missing credential: present a client certificate or send "
                "`authorization: Bearer <token>` metadata",
                reason="MISSING_CREDENTIAL",
            )
        if caller.kind == identity.OPERATOR:
            return OPERATOR
        if caller.is_service(identity.CONSOLE_SERVICE):
            # The web console reads as the operator does; the policy table gives it
            # read rows only, so no write reaches here with it.
            return OPERATOR
        if caller.kind != identity.APPLICATION:
            # The policy table admits only operators and applications; this is its backstop.
            raise PermissionDenied(
                f"{caller} may not call the core broker: it takes operators and applications",
                reason="ROLE_REQUIRED",
                metadata={"principal": str(caller), "roles": "application or operator"},
            )
        principal = await self.application(caller.name)
        if principal is None:
            raise Unauthenticated(
                f'application "{caller.name}" is not registered with the core broker '
                "(never registered, or removed): the operator registers it "
                "(RegisterApplication)",
                reason="UNKNOWN_APPLICATION",
                metadata={"principal": str(caller)},
            )
        return principal

    async def application(self, application_id: str) -> Principal | None:
        """A registered application with its agreement (None: unknown), trusted for `cache_s`."""
        now = self._clock()
        hit = self._apps.get(application_id)
        if hit is not None and hit[1] > now:
            return hit[0]
        if not is_valid_id(application_id):
            return None
        app = await self._store.application(application_id)
        if app is None:
            return None
        principal = Principal(application_id, app.qos_level, app.billing_model)
        if self._cache_s > 0:
            _put(self._apps, application_id, (principal, now + self._cache_s))
        return principal

    def forget(self, application_id: str) -> None:
        """Drop this replica's cached credentials of an application (rotated or removed)."""
        for token in [t for t, (a, _) in self._tokens.items() if a == application_id]:
            del self._tokens[token]
        self._apps.pop(application_id, None)


def _put(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def require_operator(principal: Principal) -> None:
    """Backstop of the policy table (RegisterDevice & co. admit only operators there)."""
    if not principal.is_operator:
        raise PermissionDenied(
            "this call needs the operator credential", reason="OPERATOR_CREDENTIAL_REQUIRED"
        )


def require_application(principal: Principal) -> str:
    """The caller's application id (Reserve & co. admit only applications in the policy table)."""
    if principal.application_id is None:
        raise PermissionDenied(
            "reservations are made by applications: use an application's credential",
            reason="APPLICATION_CREDENTIAL_REQUIRED",
        )
    return principal.application_id
