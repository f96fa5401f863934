"""Polatis-style switches over NETCONF (scrapli), issue 34.

The YANG module is HUBER+SUHNER Polatis's optical-switch (namespace
http://www.polatis.com/yang/optical-switch), as ONOS's Polatis NETCONF drivers use it:

* `cross-connects` / `pair` with `ingress` and `egress` port ids, edited by
  `edit-config` on `running` with `operation="merge"` (make) and `"delete"`; the
  list is `pairs` on revisions before 2017-08-04 (read from the device's capability
  `...optical-switch?module=optical-switch&revision=...`);
* `opm-power` / `port` / `power` (dBm): the ports' power monitors;
* `port-config` / `port` (`port-id`, `status` ENABLED / DISABLED) and
  `product-information` (`manufacturer`, `model-name`): the inventory.

A batch is one `edit-config`: every delete before every merge (a port is in one
cross-connect; re-patching is remove then create), which the device validates whole
and answers once its mirrors settled. The edit guards itself (`guarded_edits`): a
batch planned on the table this session last read or wrote, without a read, makes
its pairs with `operation="create"` (RFC 6241: `data-exists` if the ingress already
holds one; an egress another ingress holds is `in-use`) and removes them with
`"delete"` (`data-missing` if gone), so a table that moved meanwhile refuses the
edit whole and the batch reads it and plans again.

Ingress ports are the A side (first ends), egress ports the B side: ingress i+1 for
first end i, egress N+j+1 for second end j on an N x N switch (`?ingress=N` when it
is not half of its ports). Device errors map to the contract: an rpc-error (in-use,
operation-failed, a DISABLED port, ...) is BATCH_REJECTED with nothing applied (the
edit is atomic; planned without a read, the batch first reads and plans again), a
session that cannot be opened is SWITCH_UNREACHABLE, one lost during the edit leaves
the outcome unknown.

Address: `netconf://user@host[:port][?ingress=N]` (port 830). The password comes from
LIGHTPATH_OCS_NETCONF_PASSWORD_FILE (or a key, LIGHTPATH_OCS_NETCONF_KEY_FILE); the
host key must be in LIGHTPATH_OCS_NETCONF_KNOWN_HOSTS (OpenSSH known_hosts lines).

The client is scrapli-netconf's asyncio driver over asyncssh, on the event loop: no
thread per switch (ncclient's were 48 a pod, and queued for the GIL behind the loop), so
a pod's edits leave at once; an idle session costs nothing until the device speaks, and
one the device closed is seen closed at once (asyncssh) and opened again on the next
call. The host key is checked by asyncssh in the SSH handshake, before authenticating.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from lxml import etree

from lightpath.domain.southbound import SouthboundDevice
from lightpath.domain.torus import Fabric
from lightpath.errors import FailedPrecondition
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath.v1.optical_switch_pb2 import Fence
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

# scrapli logs at INFO every message it sends and reads, whole (a full pod: 96 of them);
# what a failed call says reaches this driver's own errors.
logging.getLogger("scrapli").setLevel(logging.WARNING)

NS = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
PAIR_REVISION = "2017-08-04"  # `pair` from this revision on, `pairs` before
_NSMAP = {"p": NS}
T = TypeVar("T")


@dataclass(frozen=True)
class NetconfAddress:
    host: str
    port: int = 830
    username: str = "admin"
    ingress: int | None = None  # ingress ports (None: half of the device's ports)

    @classmethod
    def parse(cls, url: str) -> NetconfAddress:
        u = urlsplit(url)
        if u.scheme != "netconf" or not u.hostname:
            raise ValueError(f"{url!r}: give netconf://user@host[:port][?ingress=N]")
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        if set(q) - {"ingress"}:
            raise ValueError(f"{url!r}: the only option is ingress=N")
        return cls(
            u.hostname,
            u.port or 830,
            unquote(u.username) if u.username else "admin",
            int(q["ingress"]) if "ingress" in q else None,
        )

    def __str__(self) -> str:
        return f"netconf://{self.username}@{self.host}:{self.port}"


@dataclass(frozen=True)
class NetconfCredentials:
    password: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None  # OpenSSH known_hosts file; None: ~/.ssh/known_hosts

    @property
    def known_hosts_file(self) -> str:
        return self.known_hosts or os.path.expanduser("~/.ssh/known_hosts")

    def host_key(self, host: str, port: int) -> str | None:
        """The base64 host key known_hosts pins for host:port (None: not listed there, or
        no such file). Plain and hashed (`ssh-keyscan -H`) host names."""
        try:
            lines = Path(self.known_hosts_file).read_text().splitlines()
        except OSError:
            return None
        name = host if port == 22 else f"[{host}]:{port}"
        for line in lines:
            parts = line.split()
            if len(parts) < 3 or line.startswith(("#", "@")):
                continue
            if any(_host_matches(n, name) for n in parts[0].split(",")):
                return parts[2]
        return None


def _host_matches(pattern: str, name: str) -> bool:
    """A known_hosts name (plain, or `|1|salt|hash`: HMAC-SHA1 of the name) is `name`."""
    if not pattern.startswith("|1|"):
        return pattern == name
    try:
        _, _, salt, digest = pattern.split("|", 3)
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except (ValueError, TypeError):
        return False


# compiled once: a full pod reads 48 tables of 64 pairs a batch
_PAIR_PATHS = {
    name: etree.XPath(f"//p:cross-connects/p:{name}", namespaces=_NSMAP)
    for name in ("pair", "pairs")
}
_INGRESS, _EGRESS = f"{{{NS}}}ingress", f"{{{NS}}}egress"


def _x(el, path: str) -> list:
    return el.xpath(path, namespaces=_NSMAP)


class NetconfSwitch(DeviceSwitch):
    """One Polatis-style OCS behind its NETCONF server."""

    driver_name = "NETCONF"
    guarded_edits = True

    def __init__(
        self,
        fabric: Fabric,
        device: SouthboundDevice,
        url: str,
        credentials: NetconfCredentials,
        *,
        settle_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        keys_kept: int = 1024,
    ):
        super().__init__(
            fabric, device, url, settle_timeout_s=settle_timeout_s, keys_kept=keys_kept
        )
        self.addr = NetconfAddress.parse(url)
        self.credentials = credentials
        self.connect_timeout_s = connect_timeout_s
        self._conn: Any = None  # scrapli_netconf AsyncNetconfDriver, open
        self._calls = asyncio.Lock()  # one RPC at a time on the session
        self._closing: set[asyncio.Task[None]] = set()
        self._list = "pair"
        self._ports = 0  # ports the device reports (port-config)
        self._boot = ""

    # -- the session --------------------------------------------------------------------

    async def _session(self) -> Any:
        """The NETCONF session, opened (again) if needed."""
        from scrapli_netconf.driver import AsyncNetconfDriver

        if self._conn is not None:
            if self._conn.isalive():
                return self._conn
            self._drop()  # the device closed it (a restart, a cut link)
        a, c = self.addr, self.credentials
        known = c.known_hosts_file
        if c.host_key(a.host, a.port) is None:  # asyncssh refuses too, less clearly
            raise ConnectionError(
                f"{a.host}:{a.port} is not in {known}: add its host key (ssh-keyscan -p PORT HOST)"
            )
        conn = AsyncNetconfDriver(
            a.host,
            port=a.port,
            auth_username=a.username,
            # scrapli's own check reads known_hosts by host name alone (not [host]:port) and
            # after authenticating: asyncssh's, in the handshake, is the one kept
            auth_strict_key=False,
            transport="asyncssh",
            transport_options={
                "asyncssh": {
                    "known_hosts": known,
                    "password": c.password,
                    "client_keys": [c.key_file] if c.key_file else (),
                    "agent_path": None,
                }
            },
            timeout_socket=self.connect_timeout_s,
            timeout_transport=self.settle_timeout_s,
            timeout_ops=self.settle_timeout_s,
        )
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await conn.open()
        except BaseException:
            self._close_later(conn)
            raise
        rev = ""
        for cap in conn.server_capabilities:
            if cap.startswith(NS + "?") and "revision=" in cap:
                rev = cap.split("revision=", 1)[1].split("&", 1)[0]
        self._list = "pairs" if rev and rev < PAIR_REVISION else "pair"
        # a new session, a new boot: its table is read before a batch is planned on it
        self._boot = f"{a.host}:{a.port}/session-{secrets.token_hex(4)}"
        self._conn = conn
        return conn

    async def _device_call(
        self,
        what: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        sent_is_unknown: bool = False,
    ) -> T:
        """fn(session), one call at a time; NETCONF and transport errors mapped."""
        opened = False
        try:
            async with self._calls:
                conn = await self._session()
                opened = True
                try:
                    return await fn(conn)
                except asyncio.CancelledError:
                    # the RPC's answer may still come: a new session for the next call
                    self._drop()
                    raise
        except (TableMoved, asyncio.CancelledError):
            raise
        except _Moved:
            raise DeviceFailure(
                FailedPrecondition(
                    f"switch {self.id}",
                    "its cross-connects changed since they were read: read them again",
                    reason="VERSION_MISMATCH",
                )
            ) from None
        except RpcError as err:
            raise rejected(self.id, f"{what}: {err.tag}: {err.message or err}") from err
        except Exception as exc:  # transport, SSH, socket, timeout: the session is gone
            self._drop()
            failure = unreachable(self.id, f"{self.addr} {what}", exc)
            if opened and sent_is_unknown:
                failure.progress = None
            raise failure from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._close_later(conn)

    def _close_later(self, conn: Any) -> None:
        """Close a session in the background (it may be dead already)."""

        async def close() -> None:
            with contextlib.suppress(Exception):
                await conn.close()

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _get(self, conn: Any, *containers: str) -> etree._Element:
        inner = "".join(f'<{c} xmlns="{NS}"/>' for c in containers)
        return _reply(await conn.get(filter_=inner))

    # -- the device -----------------------------------------------------------------------

    def _ingress(self) -> int:
        return self.addr.ingress if self.addr.ingress is not None else self._ports // 2

    def _to_device(self, a: int, b: int) -> tuple[int, int]:
        """(ingress, egress) port ids of the cross-connect (A-side port a, B-side port b)."""
        return self.sides.side(a)[1], self._ingress() + self.sides.side(b)[1]

    def _from_device(self, ingress: int, egress: int) -> tuple[int, int] | None:
        a = self.sides.port("A", ingress)
        b = self.sides.port("B", egress - self._ingress())
        return None if a is None or b is None else (a, b)

    async def inventory(self) -> DeviceInventory:
        async def read(conn: Any) -> tuple[list[str], str, str]:
            data = await self._get(conn, "product-information", "port-config")
            ids = [str(x) for x in _x(data, "//p:port-config/p:port/p:port-id/text()")]
            maker = "".join(_x(data, "//p:product-information/p:manufacturer/text()"))
            model = "".join(_x(data, "//p:product-information/p:model-name/text()"))
            return ids, maker, model

        ids, maker, model = await self._device_call("reading its inventory", read)
        self._ports = len(ids)
        ingress = self._ingress()
        return DeviceInventory("OCS", ingress, len(ids) - ingress, maker or "Polatis", model)

    async def read_table(self) -> tuple[dict[int, int], str]:
        if not self._ports:
            await self.inventory()

        async def read(conn: Any) -> dict[int, int]:
            return self._table(await self._get(conn, "cross-connects"))

        table = await self._device_call("reading its cross-connects", read)
        return table, self._boot

    def _table(self, data: etree._Element) -> dict[int, int]:
        """Lightpath port -> peer (both ways) of the pairs in a reply."""
        table: dict[int, int] = {}
        for p in _PAIR_PATHS[self._list](data):
            i, e = p.findtext(_INGRESS), p.findtext(_EGRESS)
            ab = self._from_device(int(i), int(e)) if i and e else None
            if ab is not None:
                table[ab[0]], table[ab[1]] = ab[1], ab[0]
        return table

    async def port_states(self) -> dict[int, tuple[int, int | None]]:
        table, _ = await self.read_table()
        return {
            p: (pb.PORT_STATE_CONNECTED if p in table else pb.PORT_STATE_DARK, table.get(p))
            for p in range(self.sides.used)
        }

    async def power(self) -> dict[int, float]:
        """Lightpath port -> what its power monitor reads (opm-power), dBm."""
        if not self._ports:
            await self.inventory()

        async def read(conn: Any) -> list[tuple[int, float]]:
            data = await self._get(conn, "opm-power")
            return [
                (int(p.findtext(f"{{{NS}}}port-id")), float(p.findtext(f"{{{NS}}}power")))
                for p in _x(data, "//p:opm-power/p:port")
            ]

        out = {}
        ingress = self._ingress()
        for port, dbm in await self._device_call("reading opm-power", read):
            lp = (
                self.sides.port("A", port)
                if port <= ingress
                else self.sides.port("B", port - ingress)
            )
            if lp is not None:
                out[lp] = dbm
        return out

    async def edit(
        self,
        edit: Plan,
        boot_id: str,
        version: int | None,
        *,
        unread: bool = False,
        fence: Fence | None = None,  # not fenced: nowhere on a Polatis to keep a token
    ) -> None:
        # planned without a read: `create` (data-exists if the ingress holds a pair) and
        # `delete` (data-missing if the pair is gone) make the edit its own guard
        make = "create" if unread else "merge"
        pairs = [("delete", *self._to_device(a, b)) for a, b in edit.deletes] + [
            (make, *self._to_device(a, b)) for a, b in edit.adds
        ]
        body = "".join(
            f'<{self._list} nc:operation="{op}">'
            f"<ingress>{i}</ingress><egress>{e}</egress></{self._list}>"
            for op, i, e in pairs
        )
        # the nc prefix declared once, not on each of 64 pairs: half the bytes to encrypt
        # and parse at both ends
        config = (
            f'<config xmlns="{NC}" xmlns:nc="{NC}"><cross-connects xmlns="{NS}">{body}'
            "</cross-connects></config>"
        )

        async def apply(conn: Any) -> None:
            if unread and self._boot != boot_id:  # another session: maybe another boot
                raise TableMoved()
            if version is not None:  # the guard: re-read just before the edit
                if digest_version(self._table(await self._get(conn, "cross-connects"))) != version:
                    raise _Moved()
            try:
                _reply(await conn.edit_config(config=config))
            except RpcError:
                if unread:  # atomic, so nothing applied: read the table and plan again
                    raise TableMoved() from None
                raise

        await self._device_call("editing its cross-connects", apply, sent_is_unknown=True)

    def settling_time_s(self) -> float:
        return 0.2

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=self.connect_timeout_s)


class RpcError(Exception):
    """The device answered with an rpc-error (RFC 6241 section 4.3)."""

    def __init__(self, tag: str, message: str):
        super().__init__(message or tag)
        self.tag, self.message = tag, message


def _reply(response: Any) -> etree._Element:
    """The rpc-reply of a scrapli-netconf response; RpcError if it holds an rpc-error."""
    reply = response.xml_result  # parsed by scrapli-netconf
    if response.failed:
        err = reply.find("{*}rpc-error")
        raise RpcError(
            err.findtext("{*}error-tag", "") if err is not None else "rpc-error",
            err.findtext("{*}error-message", "") if err is not None else response.result,
        )
    return reply


class _Moved(Exception):
    pass
