"""A tree of switches stopped together ends its Relay streams once nothing needs them,
instead of every switch waiting out its grace for its neighbours' streams (each switch
holds one to each neighbour until that neighbour stops: `lightpath down` and the
stacks' stops end all switches at once)."""

from __future__ import annotations

import asyncio

import numpy as np

from lightpath.aggregation.node import aggregate_all
from tests.agg_switch.test_contract import FIVE, vectors
from tests.agg_switch.tree import agg_tree, node_credentials, stack_tree

GRACE_S = 60.0  # each switch's; the stop must not need it
STOPPED_WITHIN_S = 20.0  # a bound on waiting, far below the grace


async def test_switches_stopped_together_end_their_relay_streams_without_the_grace(redis_url):
    tree = agg_tree(redis_url, grace_s=GRACE_S)
    t = await tree.__aenter__()
    try:
        await t.define(stack_tree())
        await t.start("before-stop", FIVE, 16)
        data = vectors(16)
        results = await aggregate_all(
            t.address(), "before-stop", data, credentials=node_credentials
        )
        want = np.sum([data[n] for n in FIVE], axis=0)
        assert all(np.array_equal(r.values, want) for r in results.values()), results
    except BaseException as exc:
        await tree.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    # every switch has relayed to its neighbours and holds their streams: the stops
    # together end within the bound only if each switch ended its own streams
    async with asyncio.timeout(STOPPED_WITHIN_S):
        await tree.__aexit__(None, None, None)
