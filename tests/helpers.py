"""Starting real services in-process for contract tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from services.common.server import RunningService, running
from services.common.settings import CommonSettings, load

SERVICES = ("cell_scheduler", "workload_scheduler", "ocs_manager", "core_broker", "agg_switch")


def settings_class(service: str) -> type[CommonSettings]:
    """The settings dataclass a service's __main__ loads."""
    import importlib
    import inspect

    module = importlib.import_module(f"services.{service}.settings")
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, CommonSettings)
        and obj.__module__ == module.__name__
    ]
    assert len(found) == 1, (
        f"services.{service}.settings must define one settings class, found {found}"
    )
    return found[0]


@contextlib.asynccontextmanager
async def serve(
    service: str,
    redis_url: str,
    env: Mapping[str, str] | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    grace: float | None = 0.5,
) -> AsyncIterator[RunningService]:
    """Run `service` as its __main__ would, but in-process on an ephemeral port."""
    import importlib

    build: Any = importlib.import_module(f"services.{service}.server").build
    settings = load(
        settings_class(service),
        {"LIGHTPATH_REDIS_URL": redis_url, "LIGHTPATH_LISTEN": "127.0.0.1:0", **(env or {})},
    )
    async with running(
        service, settings, build, tracer_provider=tracer_provider, grace=grace
    ) as svc:
        yield svc
