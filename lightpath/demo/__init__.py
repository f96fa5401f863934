"""`lightpath demo`: a scenario that exercises every service of the stack.

Each topic contributes an async step `(DemoContext) -> None` to SCENARIOS;
the steps run in order against one stack and print what they show.
"""

from __future__ import annotations

from lightpath.demo import agg, cell, cores, foundation, graph, ocs, security, switched
from lightpath.demo.context import DemoContext, Scenario
from lightpath.telemetry import configure_tracing

__all__ = ["DemoContext", "Scenario", "run_demo", "scenarios"]


def scenarios() -> list[Scenario]:
    return [
        foundation.run,
        ocs.run,
        cell.run,
        security.run,
        switched.run,
        cores.run,
        graph.run,
        agg.run,
    ]


async def run_demo(endpoints: dict[str, str]) -> int:
    ctx = DemoContext(endpoints, configure_tracing("lightpath-demo", set_global=False))
    try:
        for step in scenarios():
            await step(ctx)
    finally:
        await ctx.close()
    print("\ndemo finished", flush=True)
    return 0
