"""Starting real services in-process for contract tests."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from lightpath.security.identity import Principal, service_principal
from lightpath.security.pki import IssuedFiles, LocalCA
from lightpath_services.common.server import RunningService, running
from lightpath_services.common.settings import CommonSettings, load

SERVICES = (
    "cell_scheduler",
    "workload_scheduler",
    "ocs_manager",
    "core_broker",
    "agg_switch",
    "switch_agent",
)


def settings_class(service: str) -> type[CommonSettings]:
    """The settings dataclass a service's __main__ loads."""
    import importlib
    import inspect

    module = importlib.import_module(f"lightpath_services.{service}.settings")
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, CommonSettings)
        and obj.__module__ == module.__name__
    ]
    assert len(found) == 1, (
        f"lightpath_services.{service}.settings must define one settings class, found {found}"
    )
    return found[0]


_CA: LocalCA | None = None


def test_ca() -> LocalCA:
    """This test process's CA (made once per xdist worker; tests/conftest.py puts
    the operator's certificate in the environment, so every channel the tests open
    is mTLS as the operator unless a test asks for another identity)."""
    global _CA
    if _CA is None:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="lightpath-test-pki-")
        atexit.register(shutil.rmtree, directory, True)
        _CA = LocalCA(Path(directory), common_name="Lightpath test CA").ensure()
    return _CA


test_ca.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def identity(principal: Principal | str) -> IssuedFiles:
    """Certificate files of `principal` (`tenant:acme`, ...) from the test CA."""
    if isinstance(principal, str):
        principal = Principal.parse(principal)
    return test_ca().issue(principal)


def credentials(principal: Principal | str, *, token: str = ""):
    """Client credentials of `principal` for `lightpath.client.channel(..., credentials=...)`."""
    from lightpath.security.credentials import Credentials

    files = identity(principal)
    return Credentials.from_files(files.ca, files.cert, files.key, token=token)


def service_identity(service: str, env: Mapping[str, str]) -> Principal:
    """The principal a service process of the local stack has: scoped by its pod or switch."""
    if service in ("workload_scheduler", "ocs_manager", "switch_agent"):
        return service_principal(service, env.get("LIGHTPATH_POD_ID", "pod-1"))
    if service == "agg_switch":
        return service_principal(service, env.get("LIGHTPATH_SWITCH_ID", "root"))
    return service_principal(service)


def tls_env(principal: Principal) -> dict[str, str]:
    files = identity(principal)
    return {
        "LIGHTPATH_TLS_CERT": str(files.cert),
        "LIGHTPATH_TLS_KEY": str(files.key),
        "LIGHTPATH_TLS_CA": str(files.ca),
    }


@contextlib.asynccontextmanager
async def serve(
    service: str,
    redis_url: str,
    env: Mapping[str, str] | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    grace: float | None = 0.5,
) -> AsyncIterator[RunningService]:
    """Run `service` as its __main__ would, but in-process on an ephemeral port, with
    TLS and its own certificate from the test CA (unless `env` says otherwise)."""
    import importlib

    build: Any = importlib.import_module(f"lightpath_services.{service}.server").build
    env = dict(env or {})
    base = {
        "LIGHTPATH_REDIS_URL": redis_url,
        "LIGHTPATH_LISTEN": "127.0.0.1:0",
        "LIGHTPATH_AUDIT_LOG": "",
    }
    if env.get("LIGHTPATH_PLAINTEXT", "").lower() not in {"1", "true", "yes", "on"}:
        base.update(tls_env(service_identity(service, env)))
    settings = load(settings_class(service), {**base, **env})
    async with running(
        service, settings, build, tracer_provider=tracer_provider, grace=grace
    ) as svc:
        yield svc


async def one_of_each(
    stack: contextlib.AsyncExitStack,
    redis_url: str,
    env: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, RunningService]:
    """One of each service on one Redis, entered on `stack`: a cell with one OCS pod
    (pod-1, 8 blocks, registered with the cell), a broker and a switch, keyed
    cell / ws / ocs / broker / agg; `env` adds settings per key."""
    extra = env or {}
    cell = await stack.enter_async_context(serve("cell_scheduler", redis_url, extra.get("cell")))
    ocs = await stack.enter_async_context(
        serve(
            "ocs_manager",
            redis_url,
            {"LIGHTPATH_POD_ID": "pod-1", "LIGHTPATH_FABRIC_BLOCKS": "8", **extra.get("ocs", {})},
        )
    )
    ws = await stack.enter_async_context(
        serve(
            "workload_scheduler",
            redis_url,
            {
                "LIGHTPATH_POD_ID": "pod-1",
                "LIGHTPATH_OCS_ADDR": ocs.address,
                "LIGHTPATH_CELL_ADDR": cell.address,
                **extra.get("ws", {}),
            },
        )
    )
    broker = await stack.enter_async_context(serve("core_broker", redis_url, extra.get("broker")))
    agg = await stack.enter_async_context(serve("agg_switch", redis_url, extra.get("agg")))
    return {"cell": cell, "ws": ws, "ocs": ocs, "broker": broker, "agg": agg}


# The seed's figures, paragraphs and requirement ids: in code comments and docs, never
# in what a user reads (help, command and demo output).
PATENT_REFERENCE = re.compile(
    r"Fig\.|¶|\bseed\b|\b(?:CS|WS|CB|AG|OCS|GF|SW|X)-\d+\b|\bprocess 400\b"
)
