"""An emulator of SONiC's OCS orchagent on a real redis-server (issue 34; tests and bench).

Plays what sonic-net/SONiC doc/ocs/ocs_hld.md has orchagent and the OCS module do,
on the Redis of one emulated switch:

* at start: `DEVICE_METADATA|localhost` with `switch_type` `ocs`; every simplex port
  (`1A` .. `<a>A`, `1B` .. `<b>B`) in CONFIG_DB `OCS_PORT` (`state` `normal`) and in
  STATE_DB `OCS_PORT` (`status` `blocked`, connector fields);
* on every CONFIG_DB change (keyspace notifications, as orchagent subscribes; read
  as raw bytes, each burst one "something changed", heard when the kernel says it
  arrived): the
  whole `OCS_CROSS_CONNECT` table against what the module holds, applied at once (the
  HLD's bulk apply): the ports that move read `tuning` at once, then, after the
  settling time of the switch model (lightpath.domain.switch_timing.SwitchTiming:
  by ports moved, with the conflict penalty when a new cross-connect finds a port
  still held), `tuned` with `target_simplex_port_id`, or `blocked` when dark; STATE_DB
  `OCS_CROSS_CONNECT` follows. A cross-connect on a `force_blocked` port stays
  `blocked`; ports in `fail_ports` read `failed` (a fault drill).

One reconfiguration at a time: changes arriving while the mirrors move are applied
next, together.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from lightpath.domain.switch_timing import SwitchTiming
from lightpath_services.common.redis_packing import fast_packing

log = logging.getLogger("lightpath.switch_emulators")

CONFIG_DB, STATE_DB = 4, 6
XC, PORT, METADATA = "OCS_CROSS_CONNECT", "OCS_PORT", "DEVICE_METADATA|localhost"

# orchagent's reads and writes, each one command with one argument (the emulator of 48
# switches shares one Python process and the machine's cores with the manager it
# serves: a client's cost per argument was most of its work)
READ_LUA, WRITE_LUA = (
    resources.files(__package__).joinpath(f"sonic_{name}.lua").read_text()
    for name in ("read", "write")
)


async def _write(
    script, client: aioredis.Redis, deletes: list[str], sets: list[tuple[str, dict[str, str]]]
) -> None:
    """Delete `deletes`, then HSET each (key, fields) of `sets`: one atomic command."""
    arg = _encoded(deletes, sets)
    if arg is not None:
        await script(args=[arg], client=client)


# The kernel's arrival time of a segment (Linux; its value where Python does not name it)
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec


def arrival(
    ancillary: list[tuple[int, int, bytes]], now: float, wall_now: float | None = None
) -> float:
    """When a read's bytes arrived, on the clock of `now` (the loop's, monotonic): from the
    kernel's SO_TIMESTAMPNS stamp (wall clock, `wall_now` being now on it) of the last
    segment read, else `now`. An age beyond a minute (the wall clock stepped) counts as
    none."""
    wall = time.time() if wall_now is None else wall_now
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, ns = struct.unpack("@qq", data[:16])
            age = wall - (sec + ns / 1e9)
            return now - age if 0.0 <= age <= 60.0 else now
    return now


class StampedSocket(socket.socket):
    """A connected stream socket whose reads note when their bytes arrived (`arrived`, on
    the loop's clock: the kernel's SO_TIMESTAMPNS stamp of the last segment read, else
    when it was read). asyncio's transports read with `recv`; a server playing many
    switches in one process learns so when a switch heard a request, however long its
    loop took to get round to it."""

    arrived: float | None = None

    @classmethod
    def adopt(cls, sock: socket.socket) -> StampedSocket:
        """`sock` (accepted) as a StampedSocket; `sock` is detached."""
        out = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        if _SO_TIMESTAMPNS is not None:
            with contextlib.suppress(OSError):  # without it: when this process read them
                out.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        return out

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(bufsize, _STAMP_SPACE, flags)
        self.arrived = arrival(ancillary, time.monotonic())  # the loop's clock
        return data


def _encoded(deletes: list[str], sets: list[tuple[str, dict[str, str]]]) -> str | None:
    """WRITE_LUA's one argument, or None when there is nothing to write."""
    if not deletes and not sets:
        return None
    rows = [[k, *(x for fv in fields.items() for x in fv)] for k, fields in sets]
    return json.dumps([deletes, rows])


@dataclass
class OrchagentEmulator:
    """orchagent and the OCS module of one SONiC OCS whose Redis is at `url`."""

    url: str  # redis://host:port (the switch's Redis server)
    a_ports: int
    b_ports: int
    timing: SwitchTiming = field(default_factory=SwitchTiming)
    hwsku: str = "Lightpath-OCS-emulator"
    platform: str = "x86_64-lightpath_emulator-r0"
    config_db: int = CONFIG_DB
    state_db: int = STATE_DB
    fail_ports: set[str] = field(default_factory=set)
    settles: list[float] = field(default_factory=list)  # seconds each reconfiguration took
    applied: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (a, b)
    _task: asyncio.Task[None] | None = None
    _notes: socket.socket | None = None  # CONFIG_DB's keyspace notifications
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _heard_at: float | None = None  # when the change not yet applied was first heard
    _still_at: float = 0.0  # when the mirrors last came to rest
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    @functools.cached_property
    def ports(self) -> list[str]:  # read by every reconfiguration: built once
        return [f"{i}A" for i in range(1, self.a_ports + 1)] + [
            f"{i}B" for i in range(1, self.b_ports + 1)
        ]

    async def start(self) -> None:
        self.config = fast_packing(
            aioredis.Redis.from_url(self.url, db=self.config_db, decode_responses=True)
        )
        self.state = fast_packing(
            aioredis.Redis.from_url(self.url, db=self.state_db, decode_responses=True)
        )
        self._read = self.config.register_script(READ_LUA)
        self._names = " ".join(self.ports)
        self._write = self.config.register_script(WRITE_LUA)
        await self.config.config_set("notify-keyspace-events", "KA")
        async with self.config.pipeline(transaction=True) as pipe:
            pipe.hset(
                METADATA,
                mapping={"switch_type": "ocs", "hwsku": self.hwsku, "platform": self.platform},
            )
            for n in self.ports:
                pipe.hsetnx(f"{PORT}|{n}", "state", "normal")
            await pipe.execute()
        async with self.state.pipeline(transaction=True) as pipe:
            for n in self.ports:
                pipe.hset(
                    f"{PORT}|{n}",
                    mapping={
                        "connector_type": "LC UPC",
                        "connector_pin": "2" if n.endswith("A") else "1",
                        "status": "blocked",
                        "target_simplex_port_id": "",
                    },
                )
            await pipe.execute()
        self.applied = {}
        await self._subscribe()
        self._changed.set()  # apply what CONFIG_DB already holds (a warm start)
        self._task = asyncio.create_task(self._run(), name=f"orchagent {self.url}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError):
                await self._task
            self._task = None
        self._deafen()
        for client in (self.config, self.state):
            with contextlib.suppress(RedisError, RuntimeError):
                await client.aclose()

    async def wait_idle(self) -> None:
        """Until every change seen so far is applied (tests)."""
        while self._changed.is_set() or not self._idle.is_set():
            await asyncio.sleep(0.005)

    async def _run(self) -> None:
        while True:
            self._idle.set()
            await self._changed.wait()
            self._idle.clear()
            await asyncio.sleep(0.001)  # the rest of the transaction's notifications
            self._changed.clear()
            heard, self._heard_at = self._heard_at, None
            await self._apply(heard)

    async def _subscribe(self) -> None:
        """Keyspace notifications of CONFIG_DB's OCS tables on a raw connection: any bytes
        arriving mean "something changed" (orchagent then reads the tables whole), so a
        batch of 64 cross-connects costs one read, not 64 parsed messages. The kernel
        stamps when they arrived (SO_TIMESTAMPNS): that, not when this process got round
        to them, is when the switch heard the change (see `_apply`)."""
        u = urlsplit(self.url)
        loop = asyncio.get_running_loop()
        host, port = u.hostname or "127.0.0.1", u.port or 6379
        family, kind, proto, _, address = (
            await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            if _SO_TIMESTAMPNS is not None:
                with contextlib.suppress(OSError):  # without it: when this process read them
                    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            patterns = [f"__keyspace@{self.config_db}__:{t}|*" for t in (XC, PORT)]
            cmd = [b"PSUBSCRIBE", *(p.encode() for p in patterns)]
            await loop.sock_sendall(
                sock,
                b"*%d\r\n" % len(cmd) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in cmd),
            )
            seen = b""
            while seen.count(b"psubscribe") < len(patterns):  # both confirmed: listening
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk:
                    raise ConnectionError(f"{self.url} closed the notification connection")
                seen += chunk
        except BaseException:
            sock.close()
            raise
        self._notes = sock
        loop.add_reader(sock.fileno(), self._notified)

    def _notified(self) -> None:
        """CONFIG_DB changed (the notification socket is readable)."""
        sock = self._notes
        if sock is None:
            return
        try:
            data, ancillary, _, _ = sock.recvmsg(1 << 16, _STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(str(exc))
            return
        if not data:
            self._lost("Redis closed it")
            return
        if self._heard_at is None:
            self._heard_at = arrival(ancillary, asyncio.get_running_loop().time())
        self._changed.set()

    def _lost(self, why: str) -> None:
        log.error(
            "orchagent %s: its notification connection ended (%s); CONFIG_DB changes are "
            "no longer applied",
            self.url,
            why,
        )
        self._deafen()

    def _deafen(self) -> None:
        sock, self._notes = self._notes, None
        if sock is not None:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()

    async def _apply(self, heard: float | None = None) -> None:
        """Apply what CONFIG_DB holds; the mirrors settle `timing` after the change was
        `heard` (loop time: when its notification reached this process's socket), or once
        the mirrors came to rest if they still moved then: a real module's control CPU is
        its own, while this process plays 48 switches on shared cores, and its lag must
        not add to the model's."""
        xcs, states = await self._read(args=[f"{XC}|*", self._names])
        wanted = {
            k.partition("|")[2]: (a, b)
            for k, a, b in zip(xcs[::3], xcs[1::3], xcs[2::3], strict=True)
            if a and b
        }
        forced = {n for n, st in zip(self.ports, states, strict=True) if st == "force_blocked"}
        removed = {k: v for k, v in self.applied.items() if k not in wanted}
        added = {k: v for k, v in wanted.items() if k not in self.applied}
        if not removed and not added and not forced:
            return
        # a new cross-connect whose port another one still holds: the module resolves it
        # (the newer wins), at the conflict penalty
        holder = {p: k for k, pair in self.applied.items() if k not in removed for p in pair}
        conflicts = 0
        for k, pair in sorted(added.items()):
            for p in pair:
                old = holder.get(p)
                if old is not None and old not in removed:
                    removed[old] = self.applied[old]
                    conflicts += 1
            for p in pair:
                holder[p] = k
        moved = sorted({p for pair in (*removed.values(), *added.values()) for p in pair})
        delay = self.timing.settle_s(len(moved), len(self.ports), conflicts)
        applied = {k: v for k, v in self.applied.items() if k not in removed} | added
        # STATE_DB once the mirrors rest, built (and encoded) before they move: after the
        # wait there is one command left to send, so 48 switches sharing this process's
        # loop do not queue behind each other's bookkeeping when their settling ends
        settled = _encoded(
            [f"{XC}|{k}" for k in removed], self._settled_rows(applied, added, moved, forced)
        )
        await _write(
            self._write, self.state, [], [(f"{PORT}|{p}", {"status": "tuning"}) for p in moved]
        )
        if delay > 0:
            loop = asyncio.get_running_loop()
            start = loop.time() if heard is None else max(heard, self._still_at)
            await asyncio.sleep(max(0.0, start + delay - loop.time()))
            self._still_at = loop.time()
        self.settles.append(delay)
        self.applied = applied
        if settled is not None:
            await self._write(args=[settled], client=self.state)

    def _settled_rows(
        self,
        applied: dict[str, tuple[str, str]],
        added: dict[str, tuple[str, str]],
        moved: list[str],
        forced: set[str],
    ) -> list[tuple[str, dict[str, str]]]:
        """STATE_DB's entries once the mirrors of `moved` rest with `applied` made."""
        peer: dict[str, str] = {}
        for a, b in applied.values():
            peer[a], peer[b] = b, a
        sets: list[tuple[str, dict[str, str]]] = []
        for k, (a, b) in applied.items():
            if k in added or a in forced or b in forced:
                fields = {"a_side": a, "b_side": b}
                fields["a_side_status"] = self._status(a, forced)
                fields["b_side_status"] = self._status(b, forced)
                sets.append((f"{XC}|{k}", fields))
        for p in sorted({*moved, *forced}):
            if p in peer:
                fields = {"status": self._status(p, forced), "target_simplex_port_id": peer[p]}
            else:
                fields = {"status": "blocked", "target_simplex_port_id": ""}
            sets.append((f"{PORT}|{p}", fields))
        return sets

    def _status(self, port: str, forced: set[str]) -> str:
        if port in self.fail_ports:
            return "failed"
        if port in forced:
            return "blocked"
        return "tuned"


async def quiet_housekeeping(url: str) -> None:
    """An emulated switch's redis-server at 1 Hz housekeeping instead of Redis's 10 (`hz`,
    with `dynamic-hz` off; persistence is off already). It stands for the Redis on a
    switch's own processor: 48 of them idling at 10 Hz took some 30 ms a second of the
    cores they share with the manager they serve. What the switch's tables hold and how it
    answers do not change: `hz` paces only background work (expiring keys nobody reads,
    closing idle clients, statistics)."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("hz", 1)
        await client.config_set("dynamic-hz", "no")
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> None:
    """`python -m lightpath_services.switch_emulators.sonic --switch ID ... --dir DIR`: a redis-server
    per switch (loopback, under DIR) with orchagent emulated on it, in this process.
    Prints `ready` and then one `ID=sonic://127.0.0.1:PORT` line per switch."""
    import argparse
    import sys
    from pathlib import Path

    from lightpath.embedded_redis import EmbeddedRedis

    ap = argparse.ArgumentParser(prog="python -m lightpath_services.switch_emulators.sonic")
    ap.add_argument("--switch", action="append", required=True, help="a switch id")
    ap.add_argument("--a-ports", type=int, required=True)
    ap.add_argument("--b-ports", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--timing", default="calient-s320", help="see LIGHTPATH_AGENT_TIMING")
    args = ap.parse_args(argv)
    timing = SwitchTiming.parse(args.timing)

    async def run() -> None:
        servers, orchs = [], []
        try:
            for sid in args.switch:
                srv = EmbeddedRedis(args.dir / sid, appendonly=False)
                srv.start()
                servers.append((sid, srv))
                url = f"redis://127.0.0.1:{srv.port}"
                await quiet_housekeeping(url)
                orch = OrchagentEmulator(url, args.a_ports, args.b_ports, timing)
                await orch.start()
                orchs.append(orch)
            print("ready", flush=True)
            for sid, srv in servers:
                print(f"{sid}=sonic://127.0.0.1:{srv.port}", flush=True)
            await asyncio.Event().wait()
        finally:
            for orch in orchs:
                with contextlib.suppress(Exception):
                    await orch.stop()
            for _, srv in servers:
                srv.stop()

    import signal

    loop = asyncio.new_event_loop()
    task = loop.create_task(run())
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        loop.run_until_complete(task)
    sys.exit(0)


if __name__ == "__main__":
    main()
