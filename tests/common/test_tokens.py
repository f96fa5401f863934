"""Lightpath bearer tokens against a real Redis: issued once, verified by hash,
revoked, and an unreachable Redis is UNAVAILABLE (retryable), never a wrong answer."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from lightpath.embedded_redis import free_port
from lightpath.errors import Unavailable
from lightpath.security.identity import Principal
from lightpath.security.tokens import KEY, TokenRegistry


async def test_issue_verify_revoke(redis_client):
    registry = TokenRegistry(redis_client, cache_s=0)
    token_id, token = await registry.issue(Principal("tenant", "acme"))
    assert token.startswith(f"lpt1.{token_id}.")
    assert await registry.verify(token) == Principal("tenant", "acme")
    # Redis keeps a salted hash, never the secret
    stored = await redis_client.hget(KEY, token_id)
    assert token.rsplit(".", 1)[1] not in stored
    assert [t["principal"] for t in await registry.list()] == ["tenant:acme"]
    # a changed secret, a changed id, and a foreign token are not ours
    secret = token.rsplit(".", 1)[1]
    assert await registry.verify(token[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    assert await registry.verify(f"lpt1.{'0' * 32}.{secret}") is None
    assert await registry.verify("app-1:secret") is None
    assert await registry.revoke(token_id)
    assert await registry.verify(token) is None
    assert not await registry.revoke(token_id)


@given(st.text(max_size=80))
async def test_no_string_is_a_token_by_accident(redis_client, text):
    registry = TokenRegistry(redis_client, cache_s=0)
    assert await registry.verify(text) is None
    assert await registry.verify("lpt1." + text) is None


async def test_an_unreachable_redis_is_unavailable_not_invalid():
    client = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    try:
        with pytest.raises(Unavailable, match="cannot verify the bearer token"):
            await TokenRegistry(client).verify("lpt1." + "ab" * 16 + ".secret")
    finally:
        await client.aclose()
