"""The broker's token verifier and its caches (CB-2), without a server: what it
answers for which token, how long it trusts an answer, and `forget`."""

from __future__ import annotations

import pytest

from lightpath.errors import PermissionDenied, Unauthenticated
from lightpath.security.identity import Principal as Identity
from lightpath_services.core_broker.auth import OPERATOR, Authenticator, Principal
from lightpath_services.core_broker.store import ApplicationRecord, credential_digest


class Store:
    """The one BrokerStore method the authenticator reads, counting the reads."""

    def __init__(self):
        self.apps: dict[str, ApplicationRecord] = {}
        self.reads = 0

    def register(self, app_id: str, secret: str, qos: str = "STANDARD") -> str:
        self.apps[app_id] = ApplicationRecord(
            app_id, qos, "ON_DEMAND", "salt", credential_digest("salt", secret)
        )
        return f"{app_id}:{secret}"

    async def application(self, app_id: str) -> ApplicationRecord | None:
        self.reads += 1
        return self.apps.get(app_id)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(operator_token: str = "op-secret", cache_s: float = 2.0):
    store, clock = Store(), Clock()
    return store, clock, Authenticator(store, operator_token, cache_s, clock=clock)  # type: ignore[arg-type]


CAM = Identity("application", "cam")


async def test_tokens_name_the_operator_or_an_application_and_nothing_else():
    store, _, auth = make()
    token = store.register("cam", "s3cret")
    assert await auth.verify("op-secret") == Identity("operator", "operator")
    assert await auth.verify(token) == CAM
    for bad in ("cam:wrong", "ghost:s3cret", "cam:", ":s3cret", "no-colon", "bad id:x", "op-secre"):
        assert await auth.verify(bad) is None, bad
    # no operator token set: the empty string is no token
    _, _, open_ = make(operator_token="")
    assert await open_.verify("") is None


async def test_a_verified_token_and_its_agreement_are_trusted_for_cache_s():
    store, clock, auth = make(cache_s=2.0)
    token = store.register("cam", "s3cret", qos="PREMIUM")
    assert await auth.verify(token) == CAM
    assert await auth.principal(CAM) == Principal("cam", "PREMIUM", "ON_DEMAND")
    assert store.reads == 1  # the agreement came with the verification
    clock.t += 1.9
    assert await auth.verify(token) == CAM
    await auth.principal(CAM)
    assert store.reads == 1
    # removed: still trusted until cache_s has passed, then refused
    del store.apps["cam"]
    assert await auth.verify(token) == CAM
    clock.t += 0.2
    assert await auth.verify(token) is None
    with pytest.raises(Unauthenticated) as err:
        await auth.principal(CAM)
    assert err.value.reason == "UNKNOWN_APPLICATION"


async def test_forget_drops_the_cached_token_and_agreement_at_once():
    store, _, auth = make(cache_s=60.0)
    old = store.register("cam", "old")
    assert await auth.verify(old) == CAM
    assert (await auth.principal(CAM)).qos_level == "STANDARD"
    new = store.register("cam", "new", qos="PREMIUM")  # rotated, with a new agreement
    auth.forget("cam")
    assert await auth.verify(old) is None
    assert await auth.verify(new) == CAM
    assert (await auth.principal(CAM)).qos_level == "PREMIUM"


async def test_a_certificate_application_is_looked_up_and_cached():
    store, clock, auth = make(cache_s=2.0)
    with pytest.raises(Unauthenticated):
        await auth.principal(CAM)  # not registered (yet): not cached either
    store.register("cam", "s")
    assert await auth.principal(CAM) == Principal("cam", "STANDARD", "ON_DEMAND")
    reads = store.reads
    await auth.principal(CAM)
    assert store.reads == reads
    clock.t += 3
    await auth.principal(CAM)
    assert store.reads == reads + 1
    # a name the broker's ids do not allow is no application
    with pytest.raises(Unauthenticated):
        await auth.principal(Identity("application", "team/cam"))


async def test_zero_cache_asks_the_store_every_time():
    store, _, auth = make(cache_s=0)
    token = store.register("cam", "s")
    await auth.verify(token)
    await auth.verify(token)
    await auth.principal(CAM)
    assert store.reads == 3


async def test_callers_map_to_the_brokers_principals():
    _, _, auth = make()
    assert await auth.principal(Identity("operator", "alice")) == OPERATOR
    for who in ("tenant:acme", "node:n-1", "service:cell_scheduler"):
        with pytest.raises(PermissionDenied) as err:
            await auth.principal(Identity.parse(who))
        assert err.value.reason == "ROLE_REQUIRED"
    with pytest.raises(Unauthenticated) as missing:
        await auth.principal(None)
    assert missing.value.reason == "MISSING_CREDENTIAL"
