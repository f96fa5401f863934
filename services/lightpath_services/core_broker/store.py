"""Redis persistence of the core broker (X-4): keys, Lua scripts, the change stream.

Every broker key shares the `{broker}` hash tag (`broker_key`), so one
transaction (lightpath_services.common.txn, this store's checks and ops in store.lua) may
touch any device's schedule together with reservations, timers and the change
stream, each key declared: Redis is the arbiter of truth and each transaction is
one atomic step. Application credentials live under their own tenant tag
(`tenant_key(app, "app")`).

    lp:{broker}:devices          HASH  device id -> device JSON
    lp:{broker}:cores            HASH  device id -> cores (what the scripts check)
    lp:{broker}:alloc:<device>   ZSET  "<reservation>:<part>:<end>:<cores>" scored by start (ms)
    lp:{broker}:res:<id>         HASH  data (reservation JSON), app, v (version of its last change)
    lp:{broker}:app:<app>:res    ZSET  the application's reservation ids by creation time
    lp:{broker}:all-res          ZSET  every reservation id by creation time (operator listing)
    lp:{broker}:timers           ZSET  reservation id -> when it next starts or ends a part (ms)
    lp:{broker}:latency          HASH  "<site>|<device>" -> latency ms (CB-7)
    lp:{broker}:version          STRING  change counter, +1 per script that changed anything
    lp:{broker}:changes          STREAM  one entry per change: v, ops (capacity deltas), ev (events)
    lp:{t:<app>}:app             HASH  salt, hash (of the credential), qos, billing, created

CB-9: `commit` re-checks, on each touched device, that at no instant of each
granted interval the reserved cores exceed the device's cores, counting every
allocation already there; a group that would over-commit is refused whole
("conflict") and the caller decides again on fresher state. Allocations are
removed from a device's ZSET when they end (`reap`) or are released, so the
ZSETs hold only live and future allocations.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from lightpath.errors import Aborted
from lightpath_services.common.keys import broker_key, tenant_key
from lightpath_services.common.txn import Committed, Conflict, Program, Txn

STREAM_MAXLEN = 20_000
# A commit reads at most this many stream entries it was not decided on before it
# re-checks every device it touches instead of only those the entries add to.
MAX_UNSEEN = 64
# An allocation's ZSET member: reservation, part, end (ms), cores (what the Lua parses).
MEMBER = "%s:%d:%d:%d"
# A release / extend whose record's devices changed between the read and the write.
UNDECLARED = "undeclared-devices"
PROGRAM = Program(
    "lightpath_services.core_broker",
    "store.lua",
    {"MAX_UNSEEN": MAX_UNSEEN, "MEMBER": MEMBER, "UNDECLARED": UNDECLARED},
)
_FAMILIES = {
    "res": lambda rid: broker_key("res", rid),
    "app": lambda app: broker_key("app", app, "res"),
    "alloc": lambda dev: broker_key("alloc", dev),
}
_NAMED = ("changes", "version", "cores", "devices", "timers", "all-res", "latency")
_KEYS = {name: broker_key(name) for name in _NAMED}
# Tries of a release / extend / snapshot whose devices moved while it read them first.
_TRIES = 5
# Reservations whose devices a store remembers (then it forgets them all and reads again).
DEVICES_REMEMBERED = 100_000


def _devices_of(record: str | None) -> list[str]:
    return [part["dev"] for part in json.loads(record)["parts"]] if record else []


def allocation_member(reservation_id: str, part: int, end: int, cores: int) -> str:
    """The ZSET member of one allocation: what the scripts parse and the view keys rows by."""
    return MEMBER % (reservation_id, part, end, cores)


@dataclass
class Change:
    """One change stream entry: capacity deltas (`ops`) and events
    `[type, reservation id, application id, reservation JSON]`, both parsed on
    first use (a replica skips the entries it applied already unparsed)."""

    stream_id: str
    version: int
    raw_ops: str = "[]"
    raw_events: str = "[]"
    parsed_ops: list[list[Any]] | None = None
    parsed_events: list[list[Any]] | None = None

    @property
    def ops(self) -> list[list[Any]]:
        if self.parsed_ops is None:
            self.parsed_ops = _list(json.loads(self.raw_ops))
        return self.parsed_ops

    @property
    def events(self) -> list[list[Any]]:
        if self.parsed_events is None:
            self.parsed_events = _list(json.loads(self.raw_events))
        return self.parsed_events


@dataclass(frozen=True)
class Snapshot:
    version: int
    stream_id: str
    devices: dict[str, dict[str, Any]]
    latency: dict[tuple[str, str], float]
    allocations: dict[str, list[tuple[str, int]]]  # device -> [(member, start)]


@dataclass
class PendingReservation:
    """A decided reservation to write: its record and its parts."""

    reservation_id: str
    application_id: str
    record: dict[str, Any]
    created: int
    parts: list[tuple[str, int, int, int, str]] = field(default_factory=list)

    @property
    def started(self) -> bool:
        """Some part starts at once (its record says so; the commit announces STARTED)."""
        return any(p["started"] for p in self.record["parts"])

    def payload(self) -> dict[str, Any]:
        # the next time the sweep must look at it: a part's start, or a started part's end
        due = min(p["end"] if p["started"] else p["start"] for p in self.record["parts"])
        return {
            "id": self.reservation_id,
            "app": self.application_id,
            "data": json.dumps(self.record, separators=(",", ":")),
            "created": self.created,
            "due": due,
            "started": self.started,
            "parts": [list(p) for p in self.parts],
        }


@dataclass(frozen=True)
class CommitResult:
    version: int  # of the change written, 0 if nothing was
    stream_id: str
    # per ticket: ("exists", id) or ("groups", ["ok" | "conflict:<device>", ...])
    tickets: list[tuple[str, Any]]
    current_version: int = 0  # the store's version after the call
    rechecked: bool = True  # False: decided on the store's current state, not re-read


@dataclass(frozen=True)
class ScriptResult:
    status: str
    data: dict[str, Any] | None = None
    version: int = 0
    detail: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplicationRecord:
    application_id: str
    qos_level: str
    billing_model: str
    salt: str
    digest: str


def credential_digest(salt: str, secret: str) -> str:
    return hashlib.sha256((salt + ":" + secret).encode()).hexdigest()


def _list(value: Any) -> list:
    """cjson writes an empty array as {}."""
    return value if isinstance(value, list) else []


class BrokerStore:
    """The broker's Redis state. `redis` must decode responses (the runtime's client does)."""

    def __init__(self, redis: aioredis.Redis, *, retention_ms: int, maxlen: int = STREAM_MAXLEN):
        self._r: Any = redis  # decode_responses=True: str in, str out
        self.retention_ms = retention_ms
        self.maxlen = maxlen
        self._script = PROGRAM.bind(redis)
        self.changes_key = broker_key("changes")
        # reservation -> its devices (they never change): a release, extension or sweep
        # declares their allocations without reading the record first
        self._devices: dict[str, Sequence[str]] = {}

    @staticmethod
    def _txn(*names: str) -> Txn:
        t = Txn(families=_FAMILIES)
        for name in names:
            t.name(name, _KEYS[name])
        return t

    async def _run(self, t: Txn) -> Committed:
        t.op("publish", self.maxlen)
        return await self._script.commit(t)

    # -- reservations ---------------------------------------------------------

    async def commit(
        self,
        tickets: Sequence[tuple[Sequence[str], Sequence[Sequence[PendingReservation]]]],
        now: int,
        seen: tuple[int, str] | None = None,
    ) -> CommitResult:
        """Write decided reservations, re-checking capacity (CB-9). A ticket is
        one caller's share of a batch, (ids, groups): if any of `ids` exists
        already nothing of it is written; otherwise each group (all-or-nothing)
        is written whole or refused on a device that would over-commit.

        `seen` is the (version, stream id) of the view the groups were decided
        on. If the store is still there, nothing has changed since, so the
        decisions hold as they are and the re-check (a read of every touched
        device's schedule) is skipped; otherwise every group is checked."""
        t = self._txn("changes", "version", "cores", "timers", "all-res")
        member = t.member
        payload = []
        for ids, groups in tickets:
            for rid in ids:
                member("res", rid)
            out = []
            for g in groups:
                rows = []
                for r in g:
                    member("res", r.reservation_id)
                    member("app", r.application_id)
                    t.members("alloc", (part[0] for part in r.parts))
                    rows.append(r.payload())
                out.append(rows)
            payload.append({"ids": list(ids), "groups": out})
        t.op(
            "reserve",
            now,
            payload,
            "" if seen is None else seen[0],
            "" if seen is None else seen[1],
        )
        done = await self._run(t)
        tickets_out: list[tuple[str, Any]] = []
        for (_, groups), status in zip(tickets, done["tickets"], strict=True):
            if isinstance(status, list):
                tickets_out.append(("groups", status[1:]))
                for g, written in zip(groups, status[1:], strict=True):
                    for r in g if written == "ok" else ():
                        self._remember(r.reservation_id, [part[0] for part in r.parts])
            else:
                tickets_out.append(("exists", status.split(":", 1)[1]))
        return CommitResult(
            int(done["version"]),
            done["sid"],
            tickets_out,
            int(done["current"]),
            bool(done["rechecked"]),
        )

    async def _on_record(self, reservation_id: str, op: str, *args: Any) -> ScriptResult:
        """Run `op` on a reservation with its devices' allocations declared: as this store
        committed it, else as its record read first says (read again if they moved)."""
        devices = self._devices.get(reservation_id)
        for _ in range(_TRIES):
            if devices is None:
                devices = _devices_of(await self._r.hget(broker_key("res", reservation_id), "data"))
            t = self._txn("changes", "version", "cores", "timers")
            t.member("res", reservation_id)
            t.members("alloc", devices)
            t.op(op, *args)
            done = await self._run(t)
            status = done["status"]
            if status == UNDECLARED:
                devices = None
                continue
            if status in {"ok", "released", "ended"} and done["data"]:
                return ScriptResult(status, json.loads(done["data"]), int(done["v"]))
            return ScriptResult(status, None, 0, tuple(done.values.get("detail", ())))
        raise Aborted(f"reservation {reservation_id} kept changing; retry")

    def _remember(self, reservation_id: str, devices: Sequence[str]) -> None:
        if len(self._devices) >= DEVICES_REMEMBERED:
            self._devices.clear()
        self._devices[reservation_id] = devices

    async def release(self, reservation_id: str, app: str | None, now: int) -> ScriptResult:
        return await self._on_record(
            reservation_id, "release", now, reservation_id, app or "", self.retention_ms
        )

    async def extend(
        self, reservation_id: str, app: str | None, new_end: int, now: int
    ) -> ScriptResult:
        return await self._on_record(reservation_id, "extend", reservation_id, app or "", new_end)

    async def reap(self, now: int, limit: int = 256) -> tuple[int, int | None]:
        """Start and end the parts that are due (CB-6); returns (how many, next due or None)."""
        ids = await self._r.zrangebyscore(_KEYS["timers"], "-inf", now, start=0, num=limit)
        if not ids:
            nxt = await self._r.zrange(_KEYS["timers"], 0, 0, withscores=True)
            return 0, (int(nxt[0][1]) if nxt else None)
        unknown = [rid for rid in ids if rid not in self._devices]
        if unknown:
            async with self._r.pipeline(transaction=False) as pipe:
                for rid in unknown:
                    pipe.hget(broker_key("res", rid), "data")
                for rid, data in zip(unknown, await pipe.execute(), strict=True):
                    self._remember(rid, _devices_of(data))
        t = self._txn("changes", "version", "cores", "timers")
        for rid in ids:
            t.member("res", rid)
            t.members("alloc", self._devices.get(rid, ()))
        t.op("reap", now, self.retention_ms, *ids)
        done = await self._run(t)
        for rid in done["undeclared"]:
            self._devices.pop(rid, None)  # read again next sweep
        nxt = done["next"]
        return len(ids), (int(float(nxt)) if nxt else None)

    async def get(self, reservation_id: str) -> tuple[dict[str, Any], int] | None:
        data, v = await self._r.hmget(broker_key("res", reservation_id), ["data", "v"])
        if data is None:
            return None
        return json.loads(data), int(v or 0)

    async def get_many(self, ids: Sequence[str]) -> list[tuple[dict[str, Any], int] | None]:
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for rid in ids:
            pipe.hmget(broker_key("res", rid), ["data", "v"])
        out: list[tuple[dict[str, Any], int] | None] = []
        for data, v in await pipe.execute():
            out.append(None if data is None else (json.loads(data), int(v or 0)))
        return out

    async def list_ids(self, app: str | None, offset: int, limit: int) -> list[str]:
        """Reservation ids newest first; those whose record expired are dropped from the index."""
        key = broker_key("all-res") if app is None else broker_key("app", app, "res")
        return list(await self._r.zrevrange(key, offset, offset + limit - 1))

    async def forget(self, app: str | None, ids: Sequence[str]) -> None:
        """Drop ids whose records expired from the listing indexes."""
        if ids:
            if app is not None:
                await self._r.zrem(broker_key("app", app, "res"), *ids)
            await self._r.zrem(broker_key("all-res"), *ids)

    async def all_reservations(self) -> list[tuple[dict[str, Any], int]]:
        """Every stored reservation (tests, post-hoc checks)."""
        ids = await self._r.zrange(broker_key("all-res"), 0, -1)
        return [x for x in await self.get_many(ids) if x is not None]

    # -- devices and latency ----------------------------------------------------

    async def _device(self, t: Txn) -> ScriptResult:
        try:
            await self._run(t)
        except Conflict as c:
            return ScriptResult(c.reason, None, 0, (c.value,) if c.value else ())
        return ScriptResult("ok")

    async def upsert_device(self, device_id: str, doc: dict[str, Any]) -> ScriptResult:
        """Store a device; "busy" (detail: the cores reserved at some instant) when its
        allocations need more cores than the new record has."""
        t = self._txn("changes", "version")
        t.member("alloc", device_id)
        t.check("fits", device_id, doc["cores"])
        text = json.dumps(doc, sort_keys=True)
        t.hset(_KEYS["devices"], {device_id: text})
        t.hset(_KEYS["cores"], {device_id: doc["cores"]})
        t.op("changed", ["d", text])
        return await self._device(t)

    async def remove_device(self, device_id: str) -> ScriptResult:
        """Drop a device; "missing", or "busy" (detail: its allocations) while it holds any."""
        t = self._txn("changes", "version")
        alloc = broker_key("alloc", device_id)
        t.member("alloc", device_id)
        t.expect_field(_KEYS["devices"], device_id, True, reason="missing")
        t.check("idle", device_id)
        t.hdel(_KEYS["devices"], [device_id])
        t.hdel(_KEYS["cores"], [device_id])
        t.delete(alloc)
        t.op("changed", ["D", device_id])
        return await self._device(t)

    async def set_latencies(self, entries: Sequence[tuple[str, str, float]]) -> int:
        t = self._txn("changes", "version", "latency")
        t.op("latency", [list(e) for e in entries])
        return int((await self._run(t))["entries"])

    async def device_allocations(self, device_id: str) -> list[tuple[str, int]]:
        raw = await self._r.zrange(broker_key("alloc", device_id), 0, -1, withscores=True)
        return [(m, int(s)) for m, s in raw]

    # -- the change stream --------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """Everything the view loads, read atomically."""
        for _ in range(_TRIES):
            t = self._txn("changes", "version", "devices", "latency")
            t.members("alloc", await self._r.hkeys(_KEYS["devices"]))
            t.op("snapshot")
            got = await self._script.commit(t)
            if got["complete"]:
                break
        else:
            raise Aborted("the broker's devices kept changing while taking a snapshot; retry")
        devs, lat, allocs = got["devices"], got["latency"], got["allocations"]
        devices = {devs[i]: json.loads(devs[i + 1]) for i in range(0, len(devs), 2)}
        latency: dict[tuple[str, str], float] = {}
        for i in range(0, len(lat), 2):
            site, _, dev = lat[i].partition("|")
            latency[(site, dev)] = float(lat[i + 1])
        allocations: dict[str, list[tuple[str, int]]] = {}
        for i in range(0, len(allocs), 2):
            rows = allocs[i + 1]
            allocations[allocs[i]] = [
                (rows[j], int(float(rows[j + 1]))) for j in range(0, len(rows), 2)
            ]
        return Snapshot(int(got["version"]), got["sid"], devices, latency, allocations)

    async def read_changes(
        self, after: str, *, block_ms: int | None = None, count: int = 1000
    ) -> list[Change]:
        raw = await self._r.xread({self.changes_key: after}, count=count, block=block_ms)
        out: list[Change] = []
        for _, entries in raw or []:
            for sid, fields in entries:
                out.append(Change(sid, int(fields["v"]), fields["ops"], fields["ev"]))
        return out

    # -- applications (CB-2) ------------------------------------------------------

    async def register_application(
        self, application_id: str, qos_level: str, billing_model: str, created: int
    ) -> tuple[str, bool]:
        """Store a fresh credential (salted SHA-256 of a 256-bit secret); returns (token, rotated)."""
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        key = tenant_key(application_id, "app")
        rotated = bool(await self._r.exists(key))
        await self._r.hset(
            key,
            mapping={
                "salt": salt,
                "hash": credential_digest(salt, secret),
                "qos": qos_level,
                "billing": billing_model,
                "created": created,
            },
        )
        return f"{application_id}:{secret}", rotated

    async def application(self, application_id: str) -> ApplicationRecord | None:
        h = await self._r.hgetall(tenant_key(application_id, "app"))
        if not h:
            return None
        return ApplicationRecord(application_id, h["qos"], h["billing"], h["salt"], h["hash"])

    async def remove_application(self, application_id: str) -> bool:
        return bool(await self._r.delete(tenant_key(application_id, "app")))


def verify_secret(app: ApplicationRecord, secret: str) -> bool:
    return hmac.compare_digest(app.digest, credential_digest(app.salt, secret))
