"""The commit's re-check of the routing tables and 1xK switches (OCS-3, OCS-6), on layout 2.

Layout 2 (lua.py) stores one field per (dimension, k, port) for the OCS of every
axis, so the commit checks 6,144 fields for a 1,024-block pod instead of 98,304
(issue 15). These tests pin what the check must still refuse — a port already in
a cross-connect, a cross-connect to remove that is not there, a 1xK switch not
where the change expects it, one port given two cross-connects by one change —
with the port named and no trace left.
"""

from __future__ import annotations

import random

import grpc
import pytest
import redis.asyncio as aioredis

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.common.keys import pod_key
from lightpath_services.common.txn import Conflict
from lightpath_services.ocs_manager.lua import encode_change
from lightpath_services.ocs_manager.store import OcsStore
from lightpath_services.ocs_manager.wiring import (
    FabricChange,
    Link,
    SlicePlacement,
    link_ports,
    links,
    replace_block,
    wire_change,
)
from tests.ocs_manager.conftest import POD, rpc_error, wire_request

C = grpc.StatusCode
COUNTS = pb.WIRING_VIEW_COUNTS
LAYOUT_FIELD = "layout"


def key(role: str, *parts: object) -> str:
    return pod_key(POD, role, *parts)


async def fields(r: aioredis.Redis, k: str) -> dict[str, str]:
    return {f: v for f, v in (await r.hgetall(k)).items() if f != LAYOUT_FIELD}


# -- what the commit refuses -------------------------------------------------------------


async def test_a_port_already_cross_connected_is_refused_by_name_and_leaves_no_trace(
    ocs, redis_client
):
    # Behind the manager's back, block 9's first end (x port 9 on every x OCS, K = 1) is
    # looped to block 20's second end (64 + 20). Blocks 7 and 9 are free, so the claim
    # passes; the commit's table check is what must refuse.
    await redis_client.hset(key("ocs", "xc2", "x", 0), mapping={"9": "84", "84": "9"})
    err = await rpc_error(ocs.WireSlice(wire_request("j", [2, 1, 1], [7, 9], view=COUNTS)))
    assert err.code == C.ABORTED and err.reason == "TABLE_CONFLICT"
    assert "port 9 of ocs-x-{0..15}-0 is already cross-connected to port 84" in err.message
    # no trace: no slice, no claim, the switches as they were, the tables as they were
    assert (await rpc_error(ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="j")))).code == (
        C.NOT_FOUND
    )
    assert await redis_client.hgetall(key("ocs", "owner")) == {}
    for d in "xyz":
        assert await fields(redis_client, key("dev", "xc2", d, 0)) == {}
    assert await fields(redis_client, key("ocs", "xc2", "x", 0)) == {"9": "84", "84": "9"}
    assert await fields(redis_client, key("ocs", "xc2", "y", 0)) == {}
    # once the stray cross-connect is gone the same slice wires
    await redis_client.hdel(key("ocs", "xc2", "x", 0), "9", "84")
    out = await ocs.WireSlice(wire_request("j", [2, 1, 1], [7, 9], view=COUNTS))
    assert out.cross_connect_count == 96


async def test_a_cross_connect_to_remove_that_is_missing_is_refused_by_name(ocs, redis_client):
    await ocs.WireSlice(wire_request("j", [2, 1, 1], [7, 9], view=COUNTS))
    # x: 7 -> 9 is second end 64 + 7 = 71 to first end 9; drop one direction of it
    await redis_client.hdel(key("ocs", "xc2", "x", 0), "9")
    err = await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j")))
    assert err.code == C.ABORTED and err.reason == "TABLE_CONFLICT"
    assert "port 9 of ocs-x-{0..15}-0 is not cross-connected to port 71" in err.message
    # the release left no trace: the slice is still wired, on the switches too
    wiring = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="j", view=COUNTS))
    assert wiring.cross_connect_count == 96
    assert await fields(redis_client, key("dev", "xc2", "x", 0)) == {
        "71": "9",
        "9": "71",
        "73": "7",
        "7": "73",
    }
    assert await redis_client.hget(key("ocs", "owner"), "7") == "j"


async def test_a_one_to_many_switch_elsewhere_is_refused_by_name(ocs_k2, redis_client):
    # K = 2: wiring 7 -> 9 along x sets block 7's 1xK switches to output 1 (9 % 2) from idle
    await redis_client.hset(key("ocs", "otm2", "x"), "7", "0")
    err = await rpc_error(ocs_k2.WireSlice(wire_request("j", [2, 1, 1], [7, 9], view=COUNTS)))
    assert err.code == C.ABORTED and err.reason == "TABLE_CONFLICT"
    assert "the 1xK switches of block 7 along x are at output 0, not idle" in err.message
    assert await redis_client.hgetall(key("ocs", "owner")) == {}
    assert await fields(redis_client, key("dev", "otm2", "x")) == {}


async def test_one_port_given_two_cross_connects_by_one_change_is_refused(redis_client):
    fabric = Fabric.build(FabricConfig((4, 4, 4), 64))
    store = OcsStore(redis_client, POD, fabric)
    await store.ensure_fabric()
    placement = SlicePlacement("j", (3, 1, 1), (7, 8, 9), (False, False, False))
    token = await store.begin_wire(placement, 30_000)
    # 7 -> 9 and 8 -> 9: both want block 9's first end
    bad = FabricChange(connect=(Link(0, 7, 9), Link(0, 8, 9)))
    with pytest.raises(Conflict) as refused:
        await store.commit("j", token, "wire", bad)
    assert refused.value.reason == "CONFLICT"
    assert str(refused.value) == (
        "port 9 of ocs-x-{0..15}-0 is given two cross-connects by this change"
    )
    assert await fields(redis_client, key("ocs", "xc2", "x", 0)) == {}
    assert (await store.get_slice("j")).op is not None  # still locked: the caller aborts


# -- the pure parts the Lua relies on ----------------------------------------------------------


def _links_by_coordinates(p: SlicePlacement) -> list[Link]:
    """OCS-2 spelled out with coordinates: the oracle for `links`."""
    out = []
    for d, extent in enumerate(p.grid):
        for i in range(len(p.blocks)):
            coords = list(p.position(i))
            if coords[d] + 1 < extent:
                coords[d] += 1
            elif p.wrap[d]:
                coords[d] = 0
            else:
                continue
            out.append(Link(d, p.blocks[i], p.blocks[p.index_of(coords)]))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_links_and_their_encoding_follow_the_port_map(seed):
    rnd = random.Random(seed)
    k = rnd.choice([1, 2, 3])
    n = 64
    fabric = Fabric.build(FabricConfig((4, 4, 4), n, k, 200))
    grid = tuple(rnd.choice([1, 2, 3, 4]) for _ in range(3))
    size = grid[0] * grid[1] * grid[2]
    p = SlicePlacement(
        "j", grid, tuple(rnd.sample(range(n), size)), tuple(rnd.random() < 0.5 for _ in range(3))
    )
    assert list(links(p)) == _links_by_coordinates(p)
    spare = next(b for b in range(n) if b not in p.blocks)
    for change in (
        wire_change(fabric, p),
        wire_change(fabric, p).inverse(),
        replace_block(fabric, p, p.blocks[0], spare).change,
    ):
        enc = encode_change(fabric, change)
        for text, group in ((enc.disconnect, change.disconnect), (enc.connect, change.connect)):
            expected = [
                f"{lk.dim} {kk} {pa} {pb}"
                for lk in group
                for kk, pa, pb in [link_ports(fabric, lk)]
            ]
            assert text == " ".join(expected)
