"""Issue 30: free text a caller stores is stored once. A cancel reason (up to 1,024
characters) is kept in the job's hash only; its history, the pod's event stream (what
watchers and the cell get) and the job's reason refer to it, and every reader shows
the words."""

from __future__ import annotations

import asyncio
import contextlib
import json

import redis.asyncio as aioredis

from lightpath.domain.jobs import normalize
from lightpath.domain.slices import CANCELLED
from tests.workload_scheduler.test_busy import _spec, scheduler


async def _every_value(redis_url: str) -> list[bytes]:
    """Every value stored in Redis, of every key and type (as bytes: bitmaps too)."""
    out: list[bytes] = []
    async with aioredis.Redis.from_url(redis_url) as redis:
        async for key in redis.scan_iter(count=1000):
            out.extend(await _values(redis, key))
    return out


async def _values(redis, key: bytes) -> list[bytes]:
    kind = await redis.type(key)
    if kind == b"hash":
        return list((await redis.hgetall(key)).values())
    if kind == b"list":
        return await redis.lrange(key, 0, -1)
    if kind == b"stream":
        return [v for _, fields in await redis.xrange(key) for v in fields.values()]
    if kind == b"string":
        return [await redis.get(key)]
    if kind == b"zset":
        return await redis.zrange(key, 0, -1)
    if kind == b"set":
        return list(await redis.smembers(key))
    return []


async def test_a_cancel_reason_is_stored_once_and_every_reader_shows_it(redis_url):
    reason = "the tenant's own words " + "w" * 1000
    async with scheduler(redis_url) as (sched, store):
        spec = _spec("noted")
        await sched.admit(spec, normalize(spec, sched.fabric), validate_only=False)
        watched: list[dict] = []

        async def watch() -> None:
            async for kind, event in sched.watch_pod():
                if kind == "job" and event["to"] == CANCELLED:
                    watched.append(event)
                    return

        watcher = asyncio.ensure_future(watch())
        await asyncio.sleep(0.2)  # the watch reads from the stream's tip on
        ended = await sched.cancel("noted", reason)
        await asyncio.wait_for(watcher, 10)

        stored = [v for v in await _every_value(redis_url) if reason.encode() in v]
        assert len(stored) == 1, f"the reason is stored {len(stored)} times"

        words = f"cancelled: {reason}"
        assert ended.reason == words  # as the cancel answers it
        record = await store.job("noted", history=True)
        assert record is not None and record.reason == words
        assert record.history[-1]["reason"] == words and "note" not in record.history[-1]
        assert watched[0]["reason"] == words
        # what the heartbeat sends the cell: the stream's entries with their notes
        entries = await store.redis.xrange(store.keys.events)
        events = await store.with_notes([json.loads(f["e"]) for _, f in entries])
        assert [e["reason"] for e in events if e["to"] == CANCELLED] == [words]
        with contextlib.suppress(asyncio.CancelledError):
            watcher.cancel()


async def test_a_cancel_without_a_reason_stores_no_note(redis_url):
    async with scheduler(redis_url) as (sched, store):
        spec = _spec("plain")
        await sched.admit(spec, normalize(spec, sched.fabric), validate_only=False)
        ended = await sched.cancel("plain", "")
        assert ended.reason == "cancelled"
        assert await store.redis.hget(store.keys.job("plain"), "note") is None
        assert "note" not in ended.history[-1]
