"""Who is calling (CB-2, seed 001 ¶21, ¶38, ¶52-53).

Every call carries `authorization: Bearer <token>` in its gRPC metadata. An
application's token is `<application_id>:<secret>`; the broker keeps only a
salted SHA-256 of the secret (the secret is 256 random bits, so a fast hash
is the right one), and trusts a verified token for `cache_s` seconds without
asking Redis again (a removed or rotated credential stops working on every
replica within that time). The operator's token comes from a setting.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lightpath.errors import PermissionDenied, Unauthenticated
from services.common.keys import is_valid_id
from services.core_broker.store import BrokerStore, verify_secret

METADATA_KEY = "authorization"
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


def bearer_token(metadata: Iterable[Any] | None) -> str:
    for key, value in metadata or ():
        if key.lower() == METADATA_KEY and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            raise Unauthenticated(
                "the authorization metadata must be `Bearer <token>`",
                reason="MALFORMED_CREDENTIAL",
            )
    raise Unauthenticated(
        "missing credential: send `authorization: Bearer <token>` metadata",
        reason="MISSING_CREDENTIAL",
    )


class Authenticator:
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
        self._cache: dict[str, tuple[Principal, float]] = {}

    async def authenticate(self, metadata: Iterable[Any] | None) -> Principal:
        token = bearer_token(metadata)
        if self._operator and hmac.compare_digest(token.encode(), self._operator):
            return OPERATOR
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None and hit[1] > now:
            return hit[0]
        app_id, sep, secret = token.partition(":")
        invalid = Unauthenticated("invalid credential", reason="INVALID_CREDENTIAL")
        if not sep or not secret or not is_valid_id(app_id):
            raise invalid
        app = await self._store.application(app_id)
        if app is None or not verify_secret(app, secret):
            raise invalid
        principal = Principal(app_id, app.qos_level, app.billing_model)
        if self._cache_s > 0:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[token] = (principal, now + self._cache_s)
        return principal

    def forget(self, application_id: str) -> None:
        """Drop this replica's cached credentials of an application (rotated or removed)."""
        for token in [t for t, (p, _) in self._cache.items() if p.application_id == application_id]:
            del self._cache[token]


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise PermissionDenied(
            "this call needs the operator credential", reason="OPERATOR_CREDENTIAL_REQUIRED"
        )


def require_application(principal: Principal) -> str:
    if principal.application_id is None:
        raise PermissionDenied(
            "reservations are made by applications: use an application's credential",
            reason="APPLICATION_CREDENTIAL_REQUIRED",
        )
    return principal.application_id
