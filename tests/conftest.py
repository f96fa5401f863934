"""Fixtures shared by every test: a private real redis-server per test session
(per xdist worker), started on an ephemeral port in a temp directory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lightpath.cli._common import environ_restored
from lightpath.embedded_redis import EmbeddedRedis

# Fixtures that several test modules share: `restartable_redis`. With
# LIGHTPATH_SUITE_PROFILE (bench/suite_time.py --profile), each test's wall and CPU.
pytest_plugins = ["tests.restarts"] + (
    ["tests.suite_profile"] if os.environ.get("LIGHTPATH_SUITE_PROFILE") else []
)

# Property tests run on a loaded 2-core CI machine: no per-example deadline
# (timing is for bench/, not tests), and fixtures may be reused across examples.
settings.register_profile(
    "lightpath", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("lightpath")


@pytest.fixture(scope="session", autouse=True)
def operator_credentials() -> Iterator[None]:
    """Every channel a test opens presents the operator's certificate from the test CA
    (through LIGHTPATH_TLS_*, as a deployment would set them), unless it asks for another."""
    from tests.helpers import identity

    files = identity("operator:operator")
    with environ_restored(_TLS_ENV):
        os.environ.update(
            {
                "LIGHTPATH_TLS_CA": str(files.ca),
                "LIGHTPATH_TLS_CERT": str(files.cert),
                "LIGHTPATH_TLS_KEY": str(files.key),
            }
        )
        yield


_TLS_ENV = ("LIGHTPATH_TLS_CA", "LIGHTPATH_TLS_CERT", "LIGHTPATH_TLS_KEY")


@pytest.fixture(scope="session", autouse=True)
def no_user_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No config file of the machine's user (its contexts) reaches a test: LIGHTPATH_CONFIG
    names a file that does not exist, unless a test sets another."""
    with environ_restored(("LIGHTPATH_CONFIG", "LIGHTPATH_CONTEXT")):
        os.environ["LIGHTPATH_CONFIG"] = str(tmp_path_factory.mktemp("config") / "none.toml")
        os.environ.pop("LIGHTPATH_CONTEXT", None)
        yield


@pytest.fixture(autouse=True)
def own_user_config(
    no_user_config: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Each test its own (absent) config file: a `lightpath up` in one test records its stack
    as the current context there, which no other test then sees."""
    with environ_restored(("LIGHTPATH_CONFIG",)):
        os.environ["LIGHTPATH_CONFIG"] = str(tmp_path_factory.mktemp("config") / "config.toml")
        yield


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """URL of the session's Redis, emptied for this test."""
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


class Spans:
    """A tracer provider whose finished spans can be read back."""

    def __init__(self, service_name: str):
        from opentelemetry.sdk.resources import Resource

        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def finished(self):
        return self.exporter.get_finished_spans()


@pytest.fixture
def spans_factory():
    return Spans


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup` sends a group's tests to one worker by a `@group` suffix that
    pytest-xdist (3.8) writes to `item._nodeid`, which pytest 9.2 no longer reads (the id is
    `item._id`): without this every `xdist_group` mark is ignored and a module's stack is
    started once per worker. A no-op when xdist's suffix took effect."""
    # Longest first: the tests marked `slow` (whole stacks, restarts, long property runs)
    # are handed out before the rest, so the run ends on short tests and no worker sits
    # idle while another finishes a 45 s test at the tail. Stable: the order within each part
    # is the collection order (and so the same on every worker, as xdist requires).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)
