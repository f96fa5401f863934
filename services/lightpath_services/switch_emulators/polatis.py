"""A Polatis-style optical switch's NETCONF server over SSH (issue 34; tests and bench).

`python -m lightpath_services.switch_emulators.polatis --switch ocs-x-0-0=127.0.0.1:8301 ...`
serves one emulated switch per address (each its own SSH server, as each device has
its own management address), with the YANG module of HUBER+SUHNER's Polatis
switches as ONOS's Polatis drivers use it (namespace
http://www.polatis.com/yang/optical-switch):

* `cross-connects` / `pair` (`pairs` before revision 2017-08-04) with `ingress` and
  `egress` port ids, edited by `edit-config` with `operation="merge"` / `"delete"`
  (`"create"` refuses an ingress that holds a pair: `data-exists`; `"delete"` a pair
  that is not there: `data-missing`);
* `port-config` / `port` (`port-id`, `label`, `status` ENABLED / DISABLED);
* `opm-power` / `port` (`port-id`, `power` in dBm; state data, `get` only);
* `product-information` (`manufacturer`, `model-name`, `serial-number`,
  `software-version`).

Ports 1..N are ingress and N+1..2N egress (an N x N switch). An edit-config is
validated whole (an egress another ingress holds, a DISABLED port, an unknown port:
an rpc-error, nothing applied), then applied deletes first and answered once the
mirrors settled (lightpath.domain.switch_timing.SwitchTiming by ports moved, counted
from when the edit arrived; a merge onto an ingress that is still connected is a
conflict the switch resolves, at the penalty). NETCONF 1.0 framing (`]]>]]>`), password authentication; listens where
told (loopback in the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
from lxml import etree

from lightpath.domain.switch_timing import DARK_DBM, SwitchTiming, power_dbm
from lightpath_services.switch_emulators.sonic import StampedSocket

log = logging.getLogger("lightpath.switch_emulators")

NS = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
EOM = b"]]>]]>"
_session_ids = itertools.count(1)


def q(tag: str, ns: str = NS) -> str:
    return f"{{{ns}}}{tag}"


_CROSS_CONNECTS, _INGRESS, _EGRESS = q("cross-connects"), q("ingress"), q("egress")
_OPERATION = q("operation", NC)


@dataclass
class PolatisSwitch:
    """The device: its cross-connects (ingress -> egress) and port config."""

    name: str
    ports: int  # N: ingress 1..N, egress N+1..2N
    timing: SwitchTiming = field(default_factory=SwitchTiming)
    revision: str = "2017-08-04"
    pairs: dict[int, int] = field(default_factory=dict)
    disabled: set[int] = field(default_factory=set)
    labels: dict[int, str] = field(default_factory=dict)
    settling: set[int] = field(default_factory=set)
    settles: list[float] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _still_at: float = 0.0  # loop time the mirrors last came to rest

    @property
    def list_name(self) -> str:
        return "pairs" if self.revision < "2017-08-04" else "pair"

    @property
    def capability(self) -> str:
        return f"{NS}?module=optical-switch&revision={self.revision}"

    # -- data ------------------------------------------------------------------------

    def data(self, wanted: set[str] | None, config_only: bool) -> etree._Element:
        out = etree.Element(q("data", NC), nsmap={None: NC})

        def want(name: str) -> bool:
            return wanted is None or name in wanted

        if want("cross-connects"):
            xc = etree.SubElement(out, q("cross-connects"), nsmap={None: NS})
            for i, e in sorted(self.pairs.items()):
                p = etree.SubElement(xc, q(self.list_name))
                etree.SubElement(p, q("ingress")).text = str(i)
                etree.SubElement(p, q("egress")).text = str(e)
        if want("port-config"):
            pc = etree.SubElement(out, q("port-config"), nsmap={None: NS})
            for port in range(1, 2 * self.ports + 1):
                p = etree.SubElement(pc, q("port"))
                etree.SubElement(p, q("port-id")).text = str(port)
                etree.SubElement(p, q("label")).text = self.labels.get(port, "")
                status = "DISABLED" if port in self.disabled else "ENABLED"
                etree.SubElement(p, q("status")).text = status
        if not config_only and want("opm-power"):
            peer = {**self.pairs, **{e: i for i, e in self.pairs.items()}}
            opm = etree.SubElement(out, q("opm-power"), nsmap={None: NS})
            for port in range(1, 2 * self.ports + 1):
                p = etree.SubElement(opm, q("port"))
                etree.SubElement(p, q("port-id")).text = str(port)
                dbm = power_dbm(self.name, port, peer.get(port), port in self.settling)
                etree.SubElement(p, q("power")).text = f"{dbm:.2f}"
        if not config_only and want("product-information"):
            pi = etree.SubElement(out, q("product-information"), nsmap={None: NS})
            for tag, text in (
                ("manufacturer", "HUBER+SUHNER Polatis (Lightpath emulator)"),
                ("model-name", f"Series 7000 {self.ports}x{self.ports}"),
                ("serial-number", self.name),
                ("software-version", "emulated"),
            ):
                etree.SubElement(pi, q(tag)).text = text
        return out

    # -- edit-config ---------------------------------------------------------------------

    async def edit(self, config: etree._Element, heard: float | None = None) -> None:
        """Validate the whole edit, apply deletes then merges, settle. RpcError if refused.

        The mirrors settle the model's time after the edit was `heard` (loop time: its
        last byte reached the switch's socket, by the kernel's stamp), or after they came
        to rest if they still moved then: a real
        switch's control CPU is its own, while this process plays 48 switches on shared
        cores and parses their edits one after another."""
        deletes: list[tuple[int, int]] = []
        merges: list[tuple[int, int, bool]] = []  # (ingress, egress, a create)
        # tags compared as strings (one process parses 48 switches' edits of 64 pairs)
        mine, other = q(self.list_name), q("pairs" if self.list_name == "pair" else "pair")
        for xc in config.iter(_CROSS_CONNECTS):
            for p in xc:
                if p.tag != mine:
                    if p.tag == other:
                        raise RpcError(
                            "unknown-element", f"this revision's list is {self.list_name}"
                        )
                    continue
                op = p.get(_OPERATION, "merge")
                ends = {c.tag: c.text for c in p}  # findtext parses its path on every call
                try:
                    i = int(ends.get(_INGRESS) or "")
                    e = int(ends.get(_EGRESS) or "")
                except ValueError:
                    raise RpcError("invalid-value", "ingress and egress must be port ids") from None
                if op == "delete":
                    deletes.append((i, e))
                elif op in ("merge", "create", "replace"):
                    merges.append((i, e, op == "create"))
                else:
                    raise RpcError("operation-not-supported", f"operation {op} on a pair")
        async with self.lock:
            after = dict(self.pairs)
            held = {b: a for a, b in after.items()}  # egress -> ingress
            for i, e in deletes:
                if after.get(i) != e:
                    raise RpcError("data-missing", f"no cross-connect {i} -> {e} to delete")
                del after[i]
                del held[e]
            conflicts = 0
            for i, e, create in merges:
                if not (1 <= i <= self.ports) or not (self.ports < e <= 2 * self.ports):
                    raise RpcError(
                        "invalid-value",
                        f"{i} -> {e}: ingress is 1..{self.ports}, egress "
                        f"{self.ports + 1}..{2 * self.ports}",
                    )
                off = sorted({i, e} & self.disabled)
                if off:
                    raise RpcError("operation-failed", f"port {off[0]} is DISABLED")
                holder = held.get(e)
                if holder is not None and holder != i:
                    raise RpcError("in-use", f"egress {e} is connected to ingress {holder}")
                if create and i in after:  # RFC 6241: create fails if the entry exists
                    raise RpcError("data-exists", f"ingress {i} is connected to {after[i]}")
                if after.get(i) not in (None, e):
                    conflicts += 1  # the switch moves the ingress itself
                    held.pop(after[i], None)
                after[i] = e
                held[e] = i
            moved: set[int] = set()
            for i in set(self.pairs) | set(after):
                if self.pairs.get(i) != after.get(i):
                    moved.add(i)
                    moved.update(x for x in (self.pairs.get(i), after.get(i)) if x is not None)
            self.pairs = after
            delay = self.timing.settle_s(len(moved), 2 * self.ports, conflicts) if moved else 0.0
            if delay > 0:
                self.settling = moved
                loop = asyncio.get_running_loop()
                start = loop.time() if heard is None else max(heard, self._still_at)
                try:
                    await asyncio.sleep(max(0.0, start + delay - loop.time()))
                finally:
                    self.settling = set()
                    self._still_at = loop.time()
            if moved:
                self.settles.append(delay)


class RpcError(Exception):
    def __init__(self, tag: str, message: str):
        super().__init__(message)
        self.tag = tag


def _reply(msg_id: str | None, body: etree._Element | None) -> bytes:
    reply = etree.Element(q("rpc-reply", NC), nsmap={None: NC})
    if msg_id is not None:
        reply.set("message-id", msg_id)
    reply.append(body if body is not None else etree.Element(q("ok", NC)))
    return etree.tostring(reply)


def _error(msg_id: str | None, err: RpcError) -> bytes:
    e = etree.Element(q("rpc-error", NC))
    for tag, text in (
        ("error-type", "application"),
        ("error-tag", err.tag),
        ("error-severity", "error"),
        ("error-message", str(err)),
    ):
        etree.SubElement(e, q(tag, NC)).text = text
    return _reply(msg_id, e)


class NetconfSession(asyncssh.SSHServerSession):  # type: ignore[misc]
    def __init__(self, switch: PolatisSwitch, sock: StampedSocket | None = None):
        self.switch = switch
        self.sock = sock  # its connection's socket: when what it reads arrived
        self.buf = b""
        self.chan: asyncssh.SSHServerChannel | None = None
        # each message with the loop time its last byte arrived
        self.queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue()
        self.session_id = next(_session_ids)
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, chan) -> None:
        self.chan = chan

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "netconf"

    def session_started(self) -> None:
        hello = etree.Element(q("hello", NC), nsmap={None: NC})
        caps = etree.SubElement(hello, q("capabilities", NC))
        for c in ("urn:ietf:params:netconf:base:1.0", self.switch.capability):
            etree.SubElement(caps, q("capability", NC)).text = c
        etree.SubElement(hello, q("session-id", NC)).text = str(self.session_id)
        self._send(etree.tostring(hello))
        self.task = asyncio.ensure_future(self._serve())

    def data_received(self, data, datatype) -> None:
        self.buf += data if isinstance(data, bytes) else data.encode()
        # heard when its bytes reached the switch (the kernel's stamp of the read that
        # brought them, or later), not when this process, playing 48 switches, got to them
        arrived = self.sock.arrived if self.sock is not None else None
        now = asyncio.get_running_loop().time() if arrived is None else arrived
        while EOM in self.buf:
            msg, _, self.buf = self.buf.partition(EOM)
            self.queue.put_nowait((msg, now))

    def eof_received(self) -> bool:
        self.queue.put_nowait(None)
        return False

    def connection_lost(self, exc) -> None:
        self.queue.put_nowait(None)

    def _send(self, data: bytes) -> None:
        if self.chan is not None:
            self.chan.write(data + EOM)

    async def _serve(self) -> None:
        while (item := await self.queue.get()) is not None:
            msg, heard = item
            try:
                root = etree.fromstring(msg.strip())
            except etree.XMLSyntaxError:
                continue
            if etree.QName(root).localname != "rpc":
                continue  # the client's hello
            msg_id = root.get("message-id")
            op = root[0] if len(root) else None
            name = etree.QName(op).localname if op is not None else ""
            try:
                body = await self._rpc(name, op, heard)
                self._send(_reply(msg_id, body))
            except RpcError as err:
                self._send(_error(msg_id, err))
            if name in ("close-session", "kill-session"):
                if self.chan is not None:
                    self.chan.close()
                return

    async def _rpc(self, name: str, op, heard: float) -> etree._Element | None:
        if name in ("get", "get-config"):
            flt = op.find(q("filter", NC))
            wanted = {etree.QName(c).localname for c in flt} if flt is not None else None
            return self.switch.data(wanted, config_only=name == "get-config")
        if name == "edit-config":
            config = op.find(q("config", NC))
            if config is None:
                raise RpcError("missing-element", "edit-config needs config")
            await self.switch.edit(config, heard)
            return None
        if name in ("lock", "unlock", "close-session", "kill-session"):
            return None
        raise RpcError("operation-not-supported", f"{name} is not supported")


class _Server(asyncssh.SSHServer):  # type: ignore[misc]
    def __init__(
        self, switch: PolatisSwitch, username: str, password: str, sock: StampedSocket | None
    ):
        self.switch, self.username, self.password = switch, username, password
        self.sock = sock

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return username == self.username and password == self.password

    def session_requested(self):
        return NetconfSession(self.switch, self.sock)


class Listener:
    """One switch's SSH server: accepts on its address, each connection on a socket that
    notes when what it reads arrived (StampedSocket)."""

    def __init__(self, sock: socket.socket, task: asyncio.Task[None]):
        self.sock, self.task = sock, task

    def close(self) -> None:
        self.task.cancel()
        self.sock.close()


async def serve(
    switches: dict[str, tuple[PolatisSwitch, str, int]],
    host_key: Path,
    username: str,
    password: str,
) -> list[Listener]:
    """An SSH server per switch (name -> (switch, host, port)) speaking NETCONF."""
    key = asyncssh.read_private_key(str(host_key))
    loop = asyncio.get_running_loop()
    starting: set[asyncio.Task[None]] = set()  # handshakes under way (kept from the GC)

    async def accept(listening: socket.socket, sw: PolatisSwitch) -> None:
        while True:
            conn, _ = await loop.sock_accept(listening)
            task = loop.create_task(start(StampedSocket.adopt(conn), sw))
            starting.add(task)
            task.add_done_callback(starting.discard)

    async def start(sock: StampedSocket, sw: PolatisSwitch) -> None:
        try:
            await asyncssh.run_server(
                sock,
                server_factory=lambda: _Server(sw, username, password, sock),
                server_host_keys=[key],
                line_editor=False,
                encoding=None,
                allow_scp=False,
            )
        except (OSError, asyncssh.Error) as exc:  # a client that went away, a bad handshake
            log.info("%s: an SSH connection failed: %s", sw.name, exc)
            sock.close()

    out = []
    for sw, host, port in switches.values():
        listening = socket.create_server((host, port), reuse_port=False)
        listening.setblocking(False)
        out.append(Listener(listening, loop.create_task(accept(listening, sw))))
    return out


def write_host_key(path: Path) -> str:
    """A new ed25519 host key at `path`; answers its public key line (`ssh-ed25519 AAAA...`)."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    return key.export_public_key().decode().strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lightpath_services.switch_emulators.polatis")
    ap.add_argument("--switch", action="append", required=True, help="name=host:port")
    ap.add_argument("--ports", type=int, required=True, help="N of an N x N switch")
    ap.add_argument("--host-key", type=Path, required=True)
    ap.add_argument("--username", default="admin")
    ap.add_argument(
        "--password-env", default="POLATIS_PASSWORD", help="environment variable with it"
    )
    ap.add_argument("--timing", default="calient-s320", help="see LIGHTPATH_AGENT_TIMING")
    ap.add_argument("--revision", default="2017-08-04")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    timing = SwitchTiming.parse(args.timing)
    switches = {}
    for item in args.switch:
        name, _, addr = item.partition("=")
        host, _, port = addr.rpartition(":")
        switches[name] = (
            PolatisSwitch(name, args.ports, timing, revision=args.revision),
            host,
            int(port),
        )
    password = os.environ.get(args.password_env, "")

    async def run() -> None:
        servers = await serve(switches, args.host_key, args.username, password)
        print("ready", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            for s in servers:
                s.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()

__all__ = ["DARK_DBM", "PolatisSwitch", "main", "serve", "write_host_key"]
