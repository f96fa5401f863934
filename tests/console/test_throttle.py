"""Console sign-in is throttled per client address and per token prefix (issue 30): past
a few failed sign-ins in a window, further attempts answer 429 with Retry-After, without
a call to the services, until the window has passed (an injected clock: no waiting)."""

from __future__ import annotations

import logging

from starlette.testclient import TestClient

from lightpath.errors import Unauthenticated
from lightpath_services.common.supervisor import Supervisor
from lightpath_services.console.app import Console, build_app
from lightpath_services.console.sessions import (
    MAX_FAILURES,
    WINDOW_S,
    Sessions,
    SignInThrottle,
    token_prefix,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackends:
    """Accepts one token; counts the probes that reached the services."""

    good = "lpt1.goodid.secret"

    def __init__(self) -> None:
        self.probes = 0
        self.ocs: dict = {}
        self.broker = None
        self.agg: dict = {}

    async def list_jobs_probe(self, viewer) -> None:
        self.probes += 1
        if viewer.token != self.good:
            raise Unauthenticated("unknown token")

    async def list_pods(self, viewer) -> list:  # asked at sign-in: may it see pods?
        return []


def _app(clock: Clock) -> tuple[TestClient, FakeBackends]:
    backends = FakeBackends()
    console = Console(
        backends=backends,  # type: ignore[arg-type]
        hub=None,  # type: ignore[arg-type]
        sessions=Sessions(60.0, clock=clock),
        supervisor=Supervisor(logging.getLogger("test")),
        anonymous_reads=False,
        throttle=SignInThrottle(clock=clock),
    )
    return TestClient(build_app(console), base_url="https://console.test"), backends


def _login(client: TestClient, token: str):
    return client.post(
        "/api/login", json={"token": token}, headers={"Origin": "https://console.test"}
    )


def test_a_client_guessing_tokens_is_throttled_and_let_go_after_the_window():
    clock = Clock()
    client, backends = _app(clock)
    for i in range(MAX_FAILURES):
        assert _login(client, f"lpt1.guess{i}.x").status_code == 401
    throttled = _login(client, "lpt1.guess-next.x")
    assert throttled.status_code == 429
    assert throttled.json()["error"]["reason"] == "SIGN_IN_THROTTLED"
    assert 1 <= int(throttled.headers["retry-after"]) <= WINDOW_S
    # even the right token waits: the address is throttled, and nothing reached a service
    assert _login(client, FakeBackends.good).status_code == 429
    assert backends.probes == MAX_FAILURES
    clock.now += WINDOW_S + 1
    assert _login(client, FakeBackends.good).status_code == 200


def test_one_tokens_secret_guessed_from_many_addresses_is_throttled_by_its_prefix():
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    for i in range(MAX_FAILURES):
        assert throttle.wait_s(f"10.0.0.{i}", f"lpt1.victim.guess{i}") == 0
        throttle.failed(f"10.0.0.{i}", f"lpt1.victim.guess{i}")
    assert throttle.wait_s("10.0.0.99", "lpt1.victim.another") > 0  # a new address, same id
    assert throttle.wait_s("10.0.0.99", "lpt1.other.secret") == 0  # another token: free
    clock.now += WINDOW_S + 0.1
    assert throttle.wait_s("10.0.0.99", "lpt1.victim.another") == 0


def test_the_prefix_never_holds_the_secret():
    assert token_prefix("lpt1.abc123.s3cr3t") == "lpt1.abc123"
    assert "s3cr3t" not in token_prefix("lpt1.abc123.s3cr3t")
    assert token_prefix("cam:averylongapplicationsecret") == "cam:averylon"
