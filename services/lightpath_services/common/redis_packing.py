"""Commands encoded by hiredis (C) instead of redis-py's asyncio encoder (Python).

redis.asyncio packs every command in Python (about 15 us for an HSET with four
fields); hiredis, already a dependency for its reply parser, packs it in about
1.5 us. A SONiC OCS batch is one MULTI/EXEC of a command per cross-connect, and a
full pod programs 48 switches at once: the packing was most of the driver's CPU
(issue 34). `fast_packing(client)` makes a client's new connections use hiredis.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

_PLAIN = (str, bytes)


class HiredisPackedConnection(Connection):
    """An asyncio Redis connection whose commands hiredis encodes."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        # The common command (a one-word name, every argument str or bytes) goes to hiredis
        # as it is (str as UTF-8, the pools' encoding here): redis-py's encoder checks each
        # argument's type first, which cost four times the packing (a 64-cross-connect
        # MULTI/EXEC is some 400 arguments).
        if type(args[0]) is str and " " not in args[0] and all(type(a) in _PLAIN for a in args):
            return [hiredis.pack_command(args)]
        return self._packer.pack(*(self.encoder.encode(a) for a in args))


def fast_packing(client: aioredis.Redis) -> aioredis.Redis:
    """`client`, its pool making hiredis-packed TCP connections from now on (unchanged
    without hiredis, for TLS / unix-socket pools, or another encoding than UTF-8). Call
    before its first command."""
    pool = client.connection_pool
    utf8 = pool.connection_kwargs.get("encoding", "utf-8").lower().replace("_", "-") == "utf-8"
    if HIREDIS_AVAILABLE and utf8 and pool.connection_class is Connection:
        pool.connection_class = HiredisPackedConnection
    return client
