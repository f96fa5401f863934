"""lightpath_services.common.redis_packing: commands hiredis packs as they are must be the bytes redis-py
would have sent (issue 34: the SONiC driver's and emulator's connections)."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from lightpath_services.common.redis_packing import HiredisPackedConnection

CASES = [
    ("HSET", "OCS_CROSS_CONNECT|1A-2B", "a_side", "1A", "b_side", "2B"),
    ("HSET", "k", "label", "lightpath ocs-x-0-0 block 1 first end"),  # spaces in a value
    ("SET", "ké", "välue ✓"),  # UTF-8
    ("SET", b"raw\x00key", b"\xff\xfe"),  # bytes as they are
    ("SCAN", "0", "MATCH", "OCS_PORT|*", "COUNT", 512),  # an int: redis-py's own path
    ("SCRIPT LOAD", "return 1"),  # a two-word name: redis-py splits it
    ("EVALSHA", "abc", 0, "x"),
    ("PING",),
]


@pytest.mark.parametrize("args", CASES, ids=[str(c[0]) for c in CASES])
def test_packs_exactly_as_redis_py(args):
    ours = b"".join(HiredisPackedConnection().pack_command(*args))
    theirs = b"".join(Connection().pack_command(*args))
    assert ours == theirs


def test_refuses_what_redis_py_refuses():
    from redis.exceptions import DataError

    for conn in (Connection(), HiredisPackedConnection()):
        with pytest.raises(DataError):
            conn.pack_command("SET", "k", True)
