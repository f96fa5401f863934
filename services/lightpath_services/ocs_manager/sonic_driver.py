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
every delete, then every create, then the labels of the ports it connects, queued as
one script (WRITE_LUA) that EXEC runs.
Before it reads anything the batch WATCHes what it may touch (the ports it connects,
the cross-connects it names), so an operator's `force_blocked` or another writer's
change from the read to EXEC refuses the transaction. Reads of many hashes (the table
with the ports' `state` and `label`, STATE_DB while settling) are one read-only Lua
script each, which also answers the Redis run id (the boot id): a full pod is 48
switches x 130 ports, and the client's cost per command and per round trip was most
of its time. A batch is three round trips on one connection: the WATCH with the read,
MULTI / the script / EXEC, and (STATE_DB) the read once it settled. A batch planned on
the table the driver last knew, without a read (device_switch.py), is one script
instead (GUARDED_LUA), which writes only if the switch is as planned for every pair it
touches: two round trips.
orchagent applies the difference to the module and moves the ports through
`tuning`; the batch is applied when every port it moved reads `tuned` with its new
peer (or `blocked` when it went dark) in STATE_DB. The driver learns when to look as
SONiC's own daemons do (swss-common's SubscriberStateTable): from STATE_DB keyspace
notifications, here of the STATE_DB `OCS_CROSS_CONNECT` entry of one cross-connect
the batch makes or removes (then of a port still moving, if orchagent moved some
apart); then it reads every moved port. A switch whose Redis sends no notifications
(`notify-keyspace-events` without `K`; SONiC's own Redis has them on) is polled
instead, with a growing interval: as correct, only slower. Device answers map to the
contract's outcomes: a `force_blocked` port refuses the batch whole (ABORTED,
BATCH_REJECTED), a port that reads `failed` is PARTIALLY_APPLIED (UNAVAILABLE),
Redis out of reach is SWITCH_UNREACHABLE, and Redis restarting (a new `run_id`,
the switch's boot id) is SWITCH_RESTARTED.

Addresses: `sonic://[:password@]host[:port][?config_db=4&state_db=6]` (port 6379).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lightpath.domain.southbound import SouthboundDevice
from lightpath.domain.torus import FIRST, Fabric
from lightpath.errors import FailedPrecondition, Unavailable
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath.v1.optical_switch_pb2 import Fence
from lightpath_services.common.redis_packing import HiredisPackedConnection, fast_packing
from lightpath_services.ocs_manager.device_switch import (
    DeviceFailure,
    DeviceInventory,
    DeviceSwitch,
    Plan,
    TableMoved,
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
# Every read script answers the Redis run id first (the switch's boot id): a batch needs
# it before and after, and INFO on its own was a round trip each.
HASHES_LUA, TABLE_LUA, SETTLE_LUA, FENCE_LUA, _WRITE, _GUARDED = (
    resources.files(__package__).joinpath(f"sonic_{name}.lua").read_text()
    for name in ("hashes", "table", "settle", "fence", "write", "guarded")
)
# The writes check the batch's fence in the same script (sonic_fence.lua); a batch that
# moves nothing on a switch still records it there (KEEP_FENCE_LUA).
WRITE_LUA, GUARDED_LUA = FENCE_LUA + _WRITE, FENCE_LUA + _GUARDED
KEEP_FENCE_LUA = FENCE_LUA + "return older_than_seen(ARGV[1], ARGV[2], ARGV[3]) or 0\n"
# How long a lease's fence row is kept on the switch after its last batch: far beyond
# any change lease (30 s) and any pause a process wakes from to send a batch.
FENCE_KEPT_MS = 7 * 24 * 3600 * 1000
# How long a batch waits for a STATE_DB notification once the switch has been seen to
# send them, before it reads anyway: a notification is lost only with its connection
# (which the wait hears, and polls from then on), so this is a safety net, set beyond a
# full reconfiguration's settling (0.2 s) so that a batch settling normally is not read
# early (each early read a round trip of 48 a wire).
NOTE_FALLBACK_S = 0.5


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


class PromptConnection(HiredisPackedConnection):
    """A switch's Redis connection that sends a command when it is given. redis-py bounds a
    write by `socket_timeout` with asyncio.wait_for, which (Python 3.11) runs the write as
    a task of its own, started only after every task already ready: a full pod's 48
    batches, prepared one after another in one pass of the loop, all left at its end, the
    first switch's some 13 ms after it was ready. asyncio.timeout bounds the write in
    place, with the same error when it runs out."""

    async def send_packed_command(self, command, check_health: bool = True) -> None:
        limit, self.socket_timeout = self.socket_timeout, None
        try:
            async with asyncio.timeout(limit):
                await super().send_packed_command(command, check_health)
        except TimeoutError:
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = limit


def _fence_args(fence: Fence | None) -> tuple[str, str, str]:
    """A batch's fence as the scripts take it: lease id ("" unfenced), token, ms kept."""
    if fence is None:
        return ("", "0", "0")
    return (fence.lease_id, str(fence.token), str(FENCE_KEPT_MS))


def xc_key(a: str, b: str) -> str:
    return f"{XC}|{a}-{b}"


async def _eval(client: aioredis.Redis, script: str, *args: str, keys: Sequence[str] = ()):
    """`script` run on `client` by EVAL, every argument a str (so that hiredis packs the
    command: a registered script's numkeys is an int, which redis-py packs in Python);
    Redis caches it by its digest after the first call."""
    return await client.execute_command("EVAL", script, str(len(keys)), *keys, *args)


class SonicSwitch(DeviceSwitch):
    """One SONiC OCS, programmed through its CONFIG_DB and read back from its STATE_DB."""

    driver_name = "SONiC"
    guarded_edits = True  # GUARDED_LUA: the write checks what it touches, atomically
    fenced = True  # sonic_fence.lua: the writes check the lease's token, atomically

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
            redis = fast_packing(
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
            if redis.connection_pool.connection_class is HiredisPackedConnection:
                redis.connection_pool.connection_class = PromptConnection
            return redis

        self.config = client(self.addr.config_db)
        self.state = client(self.addr.state_db)
        # port -> its device name (`1A`), and name -> its cable label (the fabric's)
        self._names = [f"{i}{side}" for side, i in map(self.sides.side, range(self.sides.used))]
        self._labels: dict[str, str] = {}
        self._label_lines: dict[int, str] = {}
        self._ports: dict[str, int | None] = {}  # port name -> Lightpath port (parsed once)
        self._boot = ""
        # the batch under way: its connection (WATCHing until EXEC), and of the ports it
        # connects those force_blocked and those to label (read after the WATCH)
        self._conn: AbstractConnection | None = None
        self._watching = False
        self._dirty = False  # answers may be left unread on it
        self._blocked: set[str] = set()
        self._relabel: set[str] = set()
        # STATE_DB keyspace notifications of one cross-connect (the batch's), and whether
        # this switch has been seen to send them
        self._notes: PubSub | None = None
        self._channel = ""
        self._notified = False

    async def _hashes(
        self, client: aioredis.Redis, keys: list[str], *fields: str
    ) -> tuple[str, list[tuple[str | None, ...]]]:
        """(run id, HMGET `fields` of every key in `keys`), in one round trip and command."""
        flat = await _eval(client, HASHES_LUA, *fields, keys=keys)
        n = len(fields)
        return flat[0], [tuple(flat[i : i + n]) for i in range(1, len(flat), n)]

    # -- names -------------------------------------------------------------------------

    def name(self, port: int) -> str:
        if 0 <= port < len(self._names):
            return self._names[port]
        side, index = self.sides.side(port)  # ValueError: beyond the cabled ports
        return f"{index}{side}"

    def port_of(self, name: str | None) -> int | None:
        name = name or ""
        if name not in self._ports:
            m = _NAME.match(name)
            self._ports[name] = self.sides.port(m.group(2), int(m.group(1))) if m else None
        return self._ports[name]

    def label(self, port: int) -> str:
        name = self.name(port)
        label = self._labels.get(name)
        if label is None:
            label = self._labels[name] = self._label(port)
        return label

    def _label_line(self, port: int) -> str:
        """`<name> <label>` and a newline, as the write scripts take a port (kept)."""
        line = self._label_lines.get(port)
        if line is None:
            line = self._label_lines[port] = f"{self.name(port)} {self.label(port)}\n"
        return line

    def _label(self, port: int) -> str:
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
        table, boot, _, _ = await self._read()
        return table, boot

    async def _read(
        self, ports: Sequence[int] = ()
    ) -> tuple[dict[int, int], str, list[str], list[str]]:
        """(table, boot id, of `ports` those force_blocked, those whose label differs)."""
        try:
            reply = await _eval(self.config, TABLE_LUA, *self._table_args(ports))
        except RedisError as exc:
            raise unreachable(self.id, str(self.addr), exc) from exc
        return self._table_of(reply)

    def _table_args(self, ports: Sequence[int]) -> list[str]:
        return [f"{XC}|*", "".join(map(self._label_line, ports))]

    def _table_of(self, reply: list) -> tuple[dict[int, int], str, list[str], list[str]]:
        boot, flat, blocked, relabel = reply
        table: dict[int, int] = {}
        for a_name, b_name in zip(flat[::2], flat[1::2], strict=True):
            a, b = self.port_of(a_name), self.port_of(b_name)
            if a is not None and b is not None:
                table[a], table[b] = b, a
        self._boot = boot
        return table, boot, blocked, relabel

    async def port_states(self) -> dict[int, tuple[int, int | None]]:
        ports = list(range(self.sides.used))
        try:
            _, rows = await self._hashes(
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

    async def begin(self, batch: pb.ApplyBatchRequest) -> tuple[dict[int, int], str]:
        """WATCH what the batch may touch (the ports it connects, the cross-connects it
        names), then read the table and those ports' `state` and `label`: a change to
        any of them from here to EXEC (an operator's force_blocked, another writer)
        refuses the transaction. The WATCH and the read go out together, on the
        connection the batch keeps to its EXEC: one round trip."""
        connected = sorted({p for x in batch.connect for p in (x.port_a, x.port_b)})
        keys = [f"{PORT}|{self.name(p)}" for p in connected]
        for x in (*batch.disconnect, *batch.connect):
            a, b = self.sides.oriented(x.port_a, x.port_b)
            keys.append(xc_key(self.name(a), self.name(b)))
        read = ("EVAL", TABLE_LUA, "0", *self._table_args(connected))
        for attempt in range(2):
            try:
                self._conn = self._conn or await self.config.connection_pool.get_connection()
                replies = await self._send([("WATCH", *keys), read] if keys else [read])
                break
            except RedisConnectionError as exc:
                # a pooled connection the switch's Redis dropped (it restarted): once more on
                # a new one, as nothing was done; then the switch does not answer
                await self._drop_conn()
                if attempt:
                    raise unreachable(self.id, str(self.addr), exc) from exc
            except RedisError as exc:
                await self._drop_conn()
                raise unreachable(self.id, str(self.addr), exc) from exc
        self._watching = bool(keys)
        table, boot, blocked, relabel = self._table_of(replies[-1])
        self._blocked, self._relabel = set(blocked), set(relabel)
        return table, boot

    async def _send(self, commands: list[tuple]) -> list:
        """`commands` in one write on the batch's connection, and their answers. Cut short
        (an error, the batch's deadline), the connection may hold answers not read: it
        is dropped, not given back."""
        conn = self._conn
        assert conn is not None  # begun
        self._dirty = True
        await conn.send_packed_command(conn.pack_commands(commands))
        answers = [await conn.read_response() for _ in commands]
        self._dirty = False
        return answers

    async def end(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self._dirty:
                await conn.disconnect()
            elif self._watching:  # no EXEC came
                await conn.send_command("UNWATCH")
                await conn.read_response()
        except (RedisError, OSError, RuntimeError):
            with contextlib.suppress(RedisError, OSError, RuntimeError):
                await conn.disconnect()
        self._watching = self._dirty = False
        await self.config.connection_pool.release(conn)

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        self._watching = self._dirty = False
        if conn is not None:
            with contextlib.suppress(RedisError, OSError, RuntimeError):
                await conn.disconnect()
            await self.config.connection_pool.release(conn)

    async def edit(
        self,
        edit: Plan,
        boot_id: str,
        version: int | None,
        *,
        unread: bool = False,
        fence: Fence | None = None,
    ) -> None:
        # only what the write needs comes before it: a full pod's 48 batches are prepared
        # one after another, so each one's work before its write delays every later switch
        names = self._names  # the plan's ports are the cabled ones (validated)
        adds = [(names[a], names[b]) for a, b in edit.adds]
        deletes = [(names[a], names[b]) for a, b in edit.deletes]
        # heard from before the commit, so orchagent's first write is not missed
        await self._listen(xc_key(*(adds or deletes)[0]))
        if unread:
            line = self._label_line
            labels = "".join(line(p) for p in sorted({p for pair in edit.adds for p in pair}))
            await self._write_guarded(adds, deletes, labels, boot_id, fence)
        else:
            await self._commit(adds, deletes, version, fence)
        want: dict[str, tuple[str, str]] = {}
        for a, b in adds:
            want[a], want[b] = ("tuned", b), ("tuned", a)
        for pair in deletes:
            for n in pair:
                want.setdefault(n, ("blocked", ""))
        await self._settle(want, boot_id)

    async def keep_fence(self, fence: Fence) -> None:
        try:
            seen = await _eval(self.config, KEEP_FENCE_LUA, *_fence_args(fence))
        except RedisError as exc:
            raise unreachable(self.id, str(self.addr), exc) from exc
        if seen != 0:
            raise self.stale_lease(fence, int(seen))

    async def _write_guarded(
        self,
        adds: list[tuple[str, str]],
        deletes: list[tuple[str, str]],
        labels: str,
        boot: str,
        fence: Fence | None,
    ) -> None:
        """The batch planned without a read: one script that writes only if the switch is
        as planned for every pair it touches (GUARDED_LUA), in one round trip; else
        TableMoved (nothing written), or refused naming a force_blocked port."""
        write = (
            "EVAL",
            GUARDED_LUA,
            "0",
            boot,
            "".join(f"{an} {bn}\n" for an, bn in deletes),
            "".join(f"{an} {bn}\n" for an, bn in adds),
            labels,
            *_fence_args(fence),
        )
        for attempt in range(2):
            try:
                self._conn = self._conn or await self.config.connection_pool.get_connection()
            except RedisError as exc:  # not connected: this attempt sent nothing
                await self._drop_conn()
                failure = unreachable(self.id, str(self.addr), exc)
                if attempt:
                    failure.progress = None  # the first one may have
                raise failure from exc
            try:
                ((run_id, status, *blocked),) = await self._send([write])
                break
            except RedisError as exc:
                # sent, the answer lost: it may have run. Once more on a new connection
                # (a pooled one the switch's Redis dropped when it restarted): the script
                # refuses to apply twice (what it removes is gone), so that is safe
                await self._drop_conn()
                if attempt or not isinstance(exc, RedisConnectionError):
                    failure = unreachable(self.id, str(self.addr), exc)
                    failure.progress = None
                    raise failure from exc
        self._boot = run_id
        if status == "moved":
            raise TableMoved()
        if status == "stale":
            assert fence is not None
            raise self.stale_lease(fence, int(blocked[0]))
        if status == "blocked":
            raise self._blocked_refusal(blocked)

    async def _commit(
        self,
        adds: list[tuple[str, str]],
        deletes: list[tuple[str, str]],
        version: int | None,
        fence: Fence | None,
    ) -> None:
        connected = sorted({n for pair in adds for n in pair})
        sent = False
        try:
            if version is not None:  # the guard: the whole table as it is under WATCH
                existing = [k async for k in self.config.scan_iter(f"{XC}|*", count=512)]
                read = ("EVAL", TABLE_LUA, "0", f"{XC}|*", "")
                replies = await self._send([("WATCH", *existing), read] if existing else [read])
                self._watching = self._watching or bool(existing)
                if digest_version(self._table_of(replies[-1])[0]) != version:
                    raise DeviceFailure(self._moved())
            blocked = [n for n in connected if n in self._blocked]
            if blocked:
                raise self._blocked_refusal(blocked)
            write = (
                "EVAL",
                WRITE_LUA,
                "0",  # keys: none (a str, so that hiredis packs the command)
                "".join(f"{an} {bn}\n" for an, bn in deletes),
                "".join(f"{an} {bn}\n" for an, bn in adds),
                "".join(f"{n} {self._labels[n]}\n" for n in connected if n in self._relabel),
                *_fence_args(fence),
            )
            sent = True
            _, _, done = await self._send([("MULTI",), write, ("EXEC",)])
            self._watching = False  # EXEC ends the WATCH, run or refused
        except RedisError as exc:
            await self._drop_conn()
            failure = unreachable(self.id, str(self.addr), exc)
            if sent:  # EXEC went out and its answer was lost: it may have taken effect
                failure.progress = None
            raise failure from exc
        if done is None:  # a key WATCHed changed: EXEC ran nothing
            raise DeviceFailure(self._moved())
        if isinstance(done[0], list) and done[0][0] == "stale":  # nothing written
            assert fence is not None
            raise self.stale_lease(fence, int(done[0][1]))
        if isinstance(done[0], ResponseError):  # a script stops where it failed: unknown
            raise DeviceFailure(
                Unavailable(
                    f"switch {self.id}: its CONFIG_DB write failed part way ({done[0]})",
                    reason="PARTIALLY_APPLIED",
                ),
                progress=None,
            )

    def _blocked_refusal(self, blocked: list[str]) -> DeviceFailure:
        return rejected(
            self.id,
            f"port{'s' if len(blocked) > 1 else ''} {', '.join(blocked[:8])} "
            "force_blocked in CONFIG_DB OCS_PORT (an operator's override; set it "
            "back to normal to use the port)",
        )

    def _moved(self) -> FailedPrecondition:
        return FailedPrecondition(
            f"switch {self.id}",
            "its CONFIG_DB cross-connects changed while the batch was prepared (another "
            "writer): read its state again",
            reason="VERSION_MISMATCH",
        )

    async def _settle(self, want: dict[str, tuple[str, str]], boot_id: str) -> None:
        """Until every moved port reads its end state in STATE_DB (orchagent's `tuning` ->
        `tuned` / `blocked`): woken by a notification of one moved port it reads them
        all; without one (a poll, with a growing interval) it reads that port first, and
        all of them once it is done (orchagent moves a batch's ports together)."""
        pending = dict(want)
        failed: list[str] = []
        delay, cap = self.poll_s
        boot = boot_id
        spec = ""  # the read's argument, built before the wait: what is heard is read at once
        while pending:
            spec = spec or "".join(f"{n} {goal} {peer}\n" for n, (goal, peer) in pending.items())
            if self._notified:
                delay = cap = max(cap, NOTE_FALLBACK_S)
            heard = await self._heard(delay)
            delay = min(cap, delay * 1.5)
            probe = next(iter(pending))
            try:
                if not heard:  # a poll: one port first, all of them once it is done
                    row: list[str | None] = await self.state.hmget(  # type: ignore[assignment]
                        f"{PORT}|{probe}", "status", "target_simplex_port_id"
                    )
                    if row[0] != "failed" and (row[0], row[1] or "") != pending[probe]:
                        continue
                boot, *left = await _eval(self.state, SETTLE_LUA, spec)
            except RedisError as exc:
                failure = unreachable(self.id, str(self.addr), exc)
                failure.progress = None
                raise failure from exc
            if boot != boot_id:
                break
            failed += [n[1:] for n in left if n.startswith("!")]
            pending = {n: pending[n] for n in left if not n.startswith("!")}
            spec = ""
            if pending:  # orchagent moved some ports apart: hear one still moving
                await self._listen(f"{PORT}|{next(iter(pending))}")
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

    # -- STATE_DB notifications ----------------------------------------------------------

    async def _listen(self, key: str) -> None:
        """Hear STATE_DB keyspace notifications of `key` (instead of the last one). Best
        effort: without them the settling loop polls."""
        channel = f"__keyspace@{self.addr.state_db}__:{key}"
        if channel == self._channel:
            return
        try:
            if self._notes is None:
                self._notes = self.state.pubsub()
            if self._channel:
                await self._notes.unsubscribe(self._channel)
            self._channel = ""
            await self._notes.subscribe(channel)
            self._channel = channel
        except RedisError:
            await self._deafen()

    async def _heard(self, timeout: float) -> bool:
        """Until a notification of the port listened to arrives, or `timeout` passed."""
        if self._notes is None or not self._channel:
            await asyncio.sleep(timeout)
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                msg = await self._notes.get_message(timeout=left)
                if msg is not None and msg["type"] == "message":
                    self._notified = True
                    return True
        except (RedisError, OSError):
            await self._deafen()
        return False

    async def _deafen(self) -> None:
        notes, self._notes, self._channel = self._notes, None, ""
        if notes is not None:
            with contextlib.suppress(RedisError, OSError, RuntimeError):
                await notes.aclose()

    def settling_time_s(self) -> float:
        return 0.2  # Calient S320 class: a full set in <= 200 ms with deletes first

    async def close(self) -> None:
        await self._deafen()
        await self.config.aclose()
        await self.state.aclose()
