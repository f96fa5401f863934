"""SONiC OCS switches: CONFIG_DB and STATE_DB of the switch's own Redis (issue 34).

Follows sonic-net/SONiC doc/ocs/ocs_hld.md ("OCS Support in SONiC"), whose names are
used exactly:

* CONFIG_DB (database 4) `OCS_CROSS_CONNECT|<a>-<b>`: `a_side`, `b_side` (simplex port
  ids such as `1A`, `64B`); a cross-connect runs from an A-side port to a B-side port;
* CONFIG_DB `OCS_PORT|<port>`: `label` (cable tracing), `state` (`normal` /
  `force_blocked`);
* STATE_DB (database 6) `OCS_PORT|<port>`: `status` (`blocked` / `tuning` / `tuned` /
  `failed`), `target_simplex_port_id`, `connector_type`, `connector_pin`; STATE_DB
  `OCS_CROSS_CONNECT|<a>-<b>`: `a_side_status`, `b_side_status`;
* CONFIG_DB `DEVICE_METADATA|localhost`: `switch_type` is `ocs` on an OCS platform
  (`platform`, `hwsku` name the hardware).

A batch becomes one Redis transaction (MULTI/EXEC, as the HLD's batch commit):
every delete, then every create, then the labels of the ports it connects, guarded
by WATCH on the keys it reads (the ports' `state`, the cross-connects it replaces).
Reads of many hashes (the table, the ports' `state`, STATE_DB while settling) are one
read-only Lua script each, not a pipeline of HMGETs: a full pod is 48 switches x 130
ports, and the client's encoding of a command each was most of its time.
orchagent applies the difference to the module and moves the ports through
`tuning`; the batch is applied when every port it moved reads `tuned` with its new
peer (or `blocked` when it went dark) in STATE_DB. Device answers map to the
contract's outcomes: a `force_blocked` port refuses the batch whole (ABORTED,
BATCH_REJECTED), a port that reads `failed` is PARTIALLY_APPLIED (UNAVAILABLE),
Redis out of reach is SWITCH_UNREACHABLE, and Redis restarting (a new `run_id`,
the switch's boot id) is SWITCH_RESTARTED.

Addresses: `sonic://[:password@]host[:port][?config_db=4&state_db=6]` (port 6379).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, WatchError

from lightpath.domain.southbound import SouthboundDevice
from lightpath.domain.torus import FIRST, Fabric
from lightpath.errors import FailedPrecondition, Unavailable
from lightpath.redis_packing import fast_packing
from lightpath.v1 import optical_switch_pb2 as pb
from services.ocs_manager.device_switch import (
    DeviceFailure,
    DeviceInventory,
    DeviceSwitch,
    Plan,
    digest_version,
    rejected,
    unreachable,
)

CONFIG_DB, STATE_DB = 4, 6
XC = "OCS_CROSS_CONNECT"
PORT = "OCS_PORT"
METADATA = "DEVICE_METADATA|localhost"
_NAME = re.compile(r"^([1-9][0-9]*)([AB])$")

# Reads of many hashes in one command (a pipeline of HMGETs costs the client a command's
# encoding each: 48 switches x 130 ports is most of a full pod's work). Read only, so
# as safe on a switch's Redis as the swss-common scripts SONiC runs there itself.
HASHES_LUA = """
local out = {}
for _, k in ipairs(KEYS) do
  local row = redis.call('HMGET', k, unpack(ARGV))
  for i = 1, #ARGV do out[#out + 1] = row[i] end
end
return out
"""
TABLE_LUA = """
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local row = redis.call('HMGET', k, 'a_side', 'b_side')
  out[#out + 1] = row[1]
  out[#out + 1] = row[2]
end
return out
"""


@dataclass(frozen=True)
class SonicAddress:
    host: str
    port: int = 6379
    password: str | None = None
    config_db: int = CONFIG_DB
    state_db: int = STATE_DB

    @classmethod
    def parse(cls, url: str) -> SonicAddress:
        u = urlsplit(url)
        if u.scheme != "sonic" or not u.hostname:
            raise ValueError(
                f"{url!r}: give sonic://[:password@]host[:port][?config_db=4&state_db=6]"
            )
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        unknown = set(q) - {"config_db", "state_db"}
        if unknown:
            raise ValueError(f"{url!r}: unknown option {sorted(unknown)[0]} (config_db, state_db)")
        return cls(
            u.hostname,
            u.port or 6379,
            unquote(u.password) if u.password else None,
            int(q.get("config_db", CONFIG_DB)),
            int(q.get("state_db", STATE_DB)),
        )

    def __str__(self) -> str:
        dbs = (
            ""
            if (self.config_db, self.state_db) == (CONFIG_DB, STATE_DB)
            else f"?config_db={self.config_db}&state_db={self.state_db}"
        )
        return f"sonic://{self.host}:{self.port}{dbs}"


def xc_key(a: str, b: str) -> str:
    return f"{XC}|{a}-{b}"


class SonicSwitch(DeviceSwitch):
    """One SONiC OCS, programmed through its CONFIG_DB and read back from its STATE_DB."""

    driver_name = "SONiC"

    def __init__(
        self,
        fabric: Fabric,
        device: SouthboundDevice,
        url: str,
        *,
        settle_timeout_s: float = 30.0,
        connect_timeout_s: float = 2.0,
        poll_s: tuple[float, float] = (0.001, 0.010),
        keys_kept: int = 1024,
    ):
        super().__init__(
            fabric, device, url, settle_timeout_s=settle_timeout_s, keys_kept=keys_kept
        )
        self.addr = SonicAddress.parse(url)
        self.poll_s = poll_s
        self._k = fabric.ocs_of_index(device.index)[2]

        def client(db: int) -> aioredis.Redis:
            return fast_packing(
                aioredis.Redis(
                    host=self.addr.host,
                    port=self.addr.port,
                    db=db,
                    password=self.addr.password,
                    decode_responses=True,
                    socket_connect_timeout=connect_timeout_s,
                    socket_timeout=connect_timeout_s,
                    # one immediate retry (a pooled connection the switch's Redis dropped when
                    # it restarted), no backoff: a switch that does not answer is answered at
                    # once (the manager rolls back, the reconcile loop tries again)
                    retry=Retry(NoBackoff(), 1),
                )
            )

        self.config = client(self.addr.config_db)
        self.state = client(self.addr.state_db)
        self._hashes_lua = self.config.register_script(HASHES_LUA)
        self._table_lua = self.config.register_script(TABLE_LUA)
        self._boot = ""

    async def _hashes(
        self, client: aioredis.Redis, keys: list[str], *fields: str
    ) -> list[tuple[str | None, ...]]:
        """HMGET `fields` of every key in `keys`, in one round trip and one command."""
        if not keys:
            return []
        flat = await self._hashes_lua(keys=keys, args=list(fields), client=client)
        n = len(fields)
        return [tuple(flat[i : i + n]) for i in range(0, len(flat), n)]

    # -- names -------------------------------------------------------------------------

    def name(self, port: int) -> str:
        side, index = self.sides.side(port)
        return f"{index}{side}"

    def port_of(self, name: str | None) -> int | None:
        m = _NAME.match(name or "")
        return self.sides.port(m.group(2), int(m.group(1))) if m else None

    def label(self, port: int) -> str:
        seg = self.fabric.segment_at(self._k, port)
        if seg is None:
            return ""
        block, end = seg
        return f"lightpath {self.id} block {block} {'first' if end == FIRST else 'second'} end"

    # -- reads ---------------------------------------------------------------------------

    async def inventory(self) -> DeviceInventory:
        try:
            meta: dict[str, str] = await self.config.hgetall(METADATA)  # type: ignore[assignment]
            names = [
                k.partition("|")[2] async for k in self.state.scan_iter(f"{PORT}|*", count=512)
            ]
        except RedisError as exc:
            raise unreachable(self.id, str(self.addr), exc) from exc
        sides = [m.group(2) for m in map(_NAME.match, names) if m]
        kind = meta.get("switch_type", "")
        return DeviceInventory(
            kind="OCS" if kind == "ocs" else f"SONiC switch_type {kind or '(unset)'}",
            a_ports=sides.count("A"),
            b_ports=sides.count("B"),
            vendor=meta.get("platform", "SONiC"),
            model=meta.get("hwsku", ""),
        )

    async def read_table(self) -> tuple[dict[int, int], str]:
        try:
            boot = (await self.config.info("server"))["run_id"]
            flat = await self._table_lua(args=[f"{XC}|*"])
        except RedisError as exc:
            raise unreachable(self.id, str(self.addr), exc) from exc
        table: dict[int, int] = {}
        for a_name, b_name in zip(flat[::2], flat[1::2], strict=True):
            a, b = self.port_of(a_name), self.port_of(b_name)
            if a is not None and b is not None:
                table[a], table[b] = b, a
        self._boot = boot
        return table, boot

    async def port_states(self) -> dict[int, tuple[int, int | None]]:
        ports = list(range(self.sides.used))
        try:
            rows = await self._hashes(
                self.state,
                [f"{PORT}|{self.name(p)}" for p in ports],
                "status",
                "target_simplex_port_id",
            )
        except RedisError as exc:
            raise unreachable(self.id, str(self.addr), exc) from exc
        out: dict[int, tuple[int, int | None]] = {}
        for p, (status, target) in zip(ports, rows, strict=True):
            peer = self.port_of(target) if target else None
            state = {
                "tuned": pb.PORT_STATE_CONNECTED,
                "tuning": pb.PORT_STATE_SETTLING,
                "failed": pb.PORT_STATE_FAULT,
            }.get(status or "", pb.PORT_STATE_DARK)
            out[p] = (state, peer if state != pb.PORT_STATE_DARK else None)
        return out

    # -- a batch -----------------------------------------------------------------------------

    async def edit(self, edit: Plan, boot_id: str, version: int | None) -> None:
        adds = [(self.name(a), self.name(b)) for a, b in edit.adds]
        deletes = [(self.name(a), self.name(b)) for a, b in edit.deletes]
        await self._commit(edit, adds, deletes, version)
        await self._settle(edit, adds, deletes, boot_id)

    async def _commit(
        self,
        edit: Plan,
        adds: list[tuple[str, str]],
        deletes: list[tuple[str, str]],
        version: int | None,
    ) -> None:
        connected = sorted({n for pair in adds for n in pair})
        port_keys = [f"{PORT}|{n}" for n in connected]
        xc_keys = [xc_key(a, b) for a, b in (*deletes, *adds)]
        sent = False
        try:
            async with self.config.pipeline(transaction=True) as pipe:
                watched = [*port_keys, *xc_keys]
                existing: list[str] = []
                if version is not None:
                    existing = [k async for k in self.config.scan_iter(f"{XC}|*", count=512)]
                    watched += existing
                if watched:
                    await pipe.watch(*watched)
                # the reads in one command on another connection: WATCH guards the keys
                # against every writer from here to EXEC, whoever reads them
                if version is not None:
                    table: dict[int, int] = {}
                    for a_name, b_name in await self._hashes(
                        self.config, existing, "a_side", "b_side"
                    ):
                        a, b = self.port_of(str(a_name or "")), self.port_of(str(b_name or ""))
                        if a is not None and b is not None:
                            table[a], table[b] = b, a
                    if digest_version(table) != version:
                        raise DeviceFailure(self._moved())
                config = await self._hashes(self.config, port_keys, "state", "label")
                blocked = [
                    n for n, (st, _) in zip(connected, config, strict=True) if st == "force_blocked"
                ]
                if blocked:
                    raise rejected(
                        self.id,
                        f"port{'s' if len(blocked) > 1 else ''} {', '.join(blocked[:8])} "
                        "force_blocked in CONFIG_DB OCS_PORT (an operator's override; set it "
                        "back to normal to use the port)",
                    )
                pipe.multi()
                for an, bn in deletes:
                    pipe.delete(xc_key(an, bn))
                for an, bn in adds:
                    pipe.hset(xc_key(an, bn), mapping={"a_side": an, "b_side": bn})
                by_name = {self.name(p): p for pair in edit.adds for p in pair}
                for n, (_, label) in zip(connected, config, strict=True):
                    want = self.label(by_name[n])
                    if want and label != want:
                        pipe.hset(f"{PORT}|{n}", "label", want)
                sent = True
                await pipe.execute()
        except WatchError:
            raise DeviceFailure(self._moved()) from None
        except RedisError as exc:
            failure = unreachable(self.id, str(self.addr), exc)
            if sent:  # EXEC went out and its answer was lost: it may have taken effect
                failure.progress = None
            raise failure from exc

    def _moved(self) -> FailedPrecondition:
        return FailedPrecondition(
            f"switch {self.id}",
            "its CONFIG_DB cross-connects changed while the batch was prepared (another "
            "writer): read its state again",
            reason="VERSION_MISMATCH",
        )

    async def _settle(
        self,
        edit: Plan,
        adds: list[tuple[str, str]],
        deletes: list[tuple[str, str]],
        boot_id: str,
    ) -> None:
        """Until every moved port reads its end state in STATE_DB (orchagent's
        `tuning` -> `tuned` / `blocked`), polling with a growing interval."""
        want: dict[str, tuple[str, str]] = {}
        for a, b in adds:
            want[a], want[b] = ("tuned", b), ("tuned", a)
        for pair in deletes:
            for n in pair:
                want.setdefault(n, ("blocked", ""))
        pending = dict(want)
        failed: list[str] = []
        delay, cap = self.poll_s
        while pending:
            # one port first (orchagent moves a batch's ports together), then all of them
            probe = next(iter(pending))
            names = [probe]
            try:
                row: list[str | None] = await self.state.hmget(  # type: ignore[assignment]
                    f"{PORT}|{probe}", "status", "target_simplex_port_id"
                )
                if row[0] == "failed" or (row[0], row[1] or "") == pending[probe]:
                    names = list(pending)
                    rows = await self._hashes(
                        self.state,
                        [f"{PORT}|{n}" for n in names],
                        "status",
                        "target_simplex_port_id",
                    )
                else:
                    rows = [(row[0], row[1])]
            except RedisError as exc:
                failure = unreachable(self.id, str(self.addr), exc)
                failure.progress = None
                raise failure from exc
            for n, (status, target) in zip(names, rows, strict=True):
                goal, peer = pending[n]
                if status == "failed":
                    failed.append(n)
                    del pending[n]
                elif status == goal and (target or "") == peer:
                    del pending[n]
            if not pending:
                break
            await asyncio.sleep(delay)
            delay = min(cap, delay * 1.5)
        try:
            boot = (await self.config.info("server"))["run_id"]
        except RedisError:
            boot = boot_id
        if boot != boot_id:
            raise DeviceFailure(
                Unavailable(
                    f"switch {self.id} restarted (its Redis run id changed) while the batch "
                    "settled; none of it remains",
                    reason="SWITCH_RESTARTED",
                )
            )
        if failed:
            # committed, so on the switch whatever the ports did: unknown counts, and the
            # manager undoes the batch here like on every switch that applied
            raise DeviceFailure(
                Unavailable(
                    f"switch {self.id}: port{'s' if len(failed) > 1 else ''} "
                    f"{', '.join(sorted(failed)[:8])} read failed in STATE_DB after the batch "
                    "was committed",
                    reason="PARTIALLY_APPLIED",
                ),
                progress=None,
            )

    def settling_time_s(self) -> float:
        return 0.2  # Calient S320 class: a full set in <= 200 ms with deletes first

    async def close(self) -> None:
        await self.config.aclose()
        await self.state.aclose()
