"""Bearer tokens for callers that cannot hold a certificate (job systems, scripts).

A token is `lpt1.<token_id>.<secret>`: 128 random bits of id, 256 of secret.
Redis keeps, per token id, the principal it was issued to and a salted SHA-256
of the secret (a fast hash is right for 256 random bits), never the secret.
Services verify a token against Redis and trust the answer for `cache_s`
seconds, so a revoked token stops working everywhere within that time.

Issued by an operator with access to Redis (`lightpath tenant create NAME
--token`, `lightpath token create KIND:NAME`); revoked with `lightpath token
revoke ID`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from lightpath.errors import Unavailable
from lightpath.security.identity import IdentityError, Principal

PREFIX = "lpt1"
KEY = "lp:{auth}:tokens"
_CACHE_LIMIT = 10_000


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(f"{salt}:{secret}".encode()).hexdigest()


def is_lightpath_token(token: str) -> bool:
    return token.startswith(PREFIX + ".")


class TokenRegistry:
    """Issue, list, revoke and verify tokens in Redis (an async redis client)."""

    def __init__(
        self, redis: Any, *, cache_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ):
        self._redis = redis
        self._cache_s = cache_s
        self._clock = clock
        self._cache: dict[str, tuple[Principal, float]] = {}

    async def issue(self, principal: Principal) -> tuple[str, str]:
        """A new token for `principal`: (token_id, token). The token is shown once."""
        token_id = secrets.token_hex(16)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(8)
        record = {
            "kind": principal.kind,
            "name": principal.name,
            "salt": salt,
            "sha256": _digest(salt, secret),
            "created": time.time(),
        }
        await self._redis.hset(KEY, token_id, json.dumps(record))
        return token_id, f"{PREFIX}.{token_id}.{secret}"

    async def revoke(self, token_id: str) -> bool:
        self._cache.clear()
        return bool(await self._redis.hdel(KEY, token_id))

    async def list(self) -> list[dict[str, Any]]:
        raw = await self._redis.hgetall(KEY)
        out = []
        for token_id, value in raw.items():
            rec = json.loads(value)
            tid = token_id.decode() if isinstance(token_id, bytes) else token_id
            out.append(
                {
                    "token_id": tid,
                    "principal": f"{rec['kind']}:{rec['name']}",
                    "created": rec["created"],
                }
            )
        return sorted(out, key=lambda r: r["created"])

    async def verify(self, token: str) -> Principal | None:
        """The principal of a valid token; None for a token that is not ours or not valid."""
        if not is_lightpath_token(token):
            return None
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None and hit[1] > now:
            return hit[0]
        _, token_id, secret = [*token.split(".", 2), "", ""][:3]
        if not token_id or not secret or len(token_id) > 64:
            return None
        try:
            raw = await self._redis.hget(KEY, token_id)
        except RedisError as exc:
            # An infrastructure fault, not the caller's: retryable, and says what failed.
            raise Unavailable(f"cannot verify the bearer token now: Redis: {exc}") from exc
        if raw is None:
            return None
        rec = json.loads(raw)
        if not hmac.compare_digest(rec["sha256"], _digest(rec["salt"], secret)):
            return None
        try:
            principal = Principal(rec["kind"], rec["name"])
        except IdentityError:
            return None
        if self._cache_s > 0:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[token] = (principal, now + self._cache_s)
        return principal
