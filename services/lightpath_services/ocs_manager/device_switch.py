"""A real switch's own management interface behind the southbound's stub interface (issue 34).

The ocs_manager's agent driver (agent_driver.py) and its reconcile loop (reconcile.py)
program switches through `Describe`, `GetCrossConnects` and `ApplyBatch`, with the
contract of docs/ocs_southbound.md. A `DeviceSwitch` answers those three calls in
process, for one OCS, by speaking the device's own interface (subclasses: SONiC's
CONFIG_DB / STATE_DB in sonic_driver.py, NETCONF in netconf_driver.py). So a SONiC
or NETCONF switch goes through exactly the batching, rollback, fail-static and
reconcile logic a switch agent does; only the translation lives here.

What this base class does for every device:

* the port mapping: Lightpath's OCS ports are first ends (0 .. F_k-1) and second
  ends (F_k .. F_k+N-1), and every cross-connect joins one of each (wiring.py). A
  device's ports come in two sides (SONiC: A / B, Polatis: ingress / egress) and a
  cross-connect runs from one side to the other only, so first end i is A-side port
  i+1 and second end j is B-side port j+1 (`PortSides`);
* validation before anything is sent (INVALID_ARGUMENT naming the field): ports
  beyond what the fabric cables, A-to-A or B-to-B pairs, a port in two connects,
  1xK outputs (an OCS has none);
* absolute semantics compiled against what the device holds (`plan`): a disconnect
  of a pair that is not connected is nothing, a connect first removes either port's
  old cross-connect, in one edit whose deletes come before its adds (the devices'
  rule: one cross-connect per port, re-patching is remove then create);
* idempotency: the outcome of the last `keys_kept` accepted batch ids, success or
  failure (a bad batch, or a device out of reach before anything was sent, is not
  kept); a repeat answers it (waiting if the first is still settling); a batch runs
  to its end even if its caller goes away;
* one batch at a time per switch; errors as the agent's (google.rpc.ErrorInfo with
  `applied_*`, `version`, `boot_id`), raised as grpc.aio.AioRpcError;
* a batch planned without a read, where the device guards its edit (`guarded_edits`:
  every pair the edit deletes must be there and every pair it makes must find its
  ingress free, checked by the device in the same atomic step as the write; NETCONF
  `delete` / `create`, a SONiC script): on the table this driver last read or wrote
  in the same boot, when that table says every operation of the batch moves
  something (so the device checks each one). A refusal (`TableMoved`: nothing was
  applied) reads the table and plans again. A read before each of a full pod's 48
  batches was most of a wire's time before its switches could start to settle.

`version` of a device switch is a digest of its cross-connect table (devices keep no
counter): equal means unchanged, which is all `expect_version` needs. `boot_id` is
what the device says changes when it lost its state (SONiC: its Redis's run id;
NETCONF: the session the state was read on).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.protobuf import duration_pb2

from lightpath.domain.southbound import SouthboundDevice
from lightpath.domain.torus import Fabric
from lightpath.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LightpathError,
    NotFound,
    Unavailable,
)
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath.v1.optical_switch_pb2 import Fence
from lightpath_services.common.errors import to_status_proto
from lightpath_services.common.idempotency import KeptBatches

log = logging.getLogger("lightpath.ocs_manager")

Pair = tuple[int, int]

BATCH_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


@dataclass(frozen=True)
class PortSides:
    """Lightpath ports of one OCS <-> a two-sided device's ports: first end i is A-side
    port i+1 (SONiC `<i+1>A`, Polatis ingress i+1), second end j is B-side port j+1."""

    first_ends: int  # F_k
    second_ends: int  # N (blocks)

    @classmethod
    def of(cls, fabric: Fabric, device: SouthboundDevice) -> PortSides:
        k = fabric.ocs_of_index(device.index)[2]
        return cls(fabric.first_ends[k], fabric.block_count)

    @property
    def used(self) -> int:
        return self.first_ends + self.second_ends

    def side(self, port: int) -> tuple[str, int]:
        """("A" | "B", 1-based index on that side); ValueError beyond the cabled ports."""
        if port < self.first_ends:
            return "A", port + 1
        if port < self.used:
            return "B", port - self.first_ends + 1
        raise ValueError(f"port {port} is beyond the {self.used} ports the fabric cables")

    def port(self, side: str, index: int) -> int | None:
        """The Lightpath port of a device port, or None if the fabric does not use it."""
        if side == "A" and 1 <= index <= self.first_ends:
            return index - 1
        if side == "B" and 1 <= index <= self.second_ends:
            return self.first_ends + index - 1
        return None

    def oriented(self, p: int, q: int) -> Pair:
        """(A-side port, B-side port) of a cross-connect; ValueError if not one of each."""
        f, used = self.first_ends, self.used  # the common case first: 64 pairs a batch
        if 0 <= p < f and f <= q < used:
            return p, q
        if 0 <= q < f and f <= p < used:
            return q, p
        sp, sq = self.side(p)[0], self.side(q)[0]
        if sp == sq:
            raise ValueError(
                f"ports {p} and {q} are both {sp}-side: a cross-connect runs from the A side "
                "(first ends) to the B side (second ends)"
            )
        return (p, q) if sp == "A" else (q, p)


@dataclass(frozen=True)
class Plan:
    """One edit of a device: remove `deletes`, then create `adds` (pairs as (A, B))."""

    deletes: tuple[Pair, ...]
    adds: tuple[Pair, ...]
    after: dict[int, int]  # the table once applied (both ways)

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.adds)

    @property
    def moved(self) -> set[int]:
        return {p for pair in (*self.deletes, *self.adds) for p in pair}


def plan(sides: PortSides, held: dict[int, int], batch: pb.ApplyBatchRequest) -> Plan:
    """The deletes and adds that take a device holding `held` (port -> peer, both ways)
    where the batch's absolute operations say. Pure."""
    table = dict(held)
    deletes: set[Pair] = set()
    adds: set[Pair] = set()
    oriented = sides.oriented

    def remove(p: int) -> None:
        q = table.pop(p)
        table.pop(q, None)
        pair = oriented(p, q)
        if pair in adds:
            adds.discard(pair)
        else:
            deletes.add(pair)

    for x in batch.disconnect:
        p = x.port_a
        if table.get(p) == x.port_b:
            remove(p)
    for x in batch.connect:
        p, q = x.port_a, x.port_b
        if table.get(p) == q:
            continue
        if p in table:
            remove(p)
        if q in table:
            remove(q)
        pair = oriented(p, q)
        if pair in deletes:
            deletes.discard(pair)  # removed above, wanted back: it never moves
        else:
            adds.add(pair)
        table[p], table[q] = q, p
    return Plan(tuple(sorted(deletes)), tuple(sorted(adds)), table)


def digest_version(table: dict[int, int]) -> int:
    """A device switch's `version`: a 63-bit digest of its cross-connects (each pair one
    64-bit word, sorted; computed for every batch, so cheap: no repr of 64 tuples)."""
    words = sorted([p << 32 | q for p, q in table.items() if p < q])
    data = struct.pack(f">{len(words)}Q", *words)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def pairs_of(table: dict[int, int]) -> list[Pair]:
    return sorted((p, q) for p, q in table.items() if p < q)


class TableMoved(Exception):
    """A device refused an edit planned on the table the driver last knew: the table is
    not that any more (nothing was applied). The batch reads it and plans again."""


def moves_all(held: dict[int, int], batch: pb.ApplyBatchRequest) -> bool:
    """Whether every operation of `batch` changes `held` (each disconnect removes a pair
    it holds, each connect makes one it does not): then the edit planned on `held`
    names every pair the batch is about, and a device guarding its edits checks each."""
    get = held.get
    for x in batch.disconnect:
        if get(x.port_a) != x.port_b:
            return False
    for x in batch.connect:
        if get(x.port_a) == x.port_b:
            return False
    return True


class DeviceFailure(Exception):
    """What a device said when a batch failed: the status to answer and how far it got
    (`progress` None: unknown, so the caller treats the switch as touched)."""

    def __init__(
        self,
        error: LightpathError,
        progress: tuple[int, int] | None = (0, 0),
    ):
        super().__init__(error.message)
        self.error = error
        self.progress = progress


@dataclass
class DeviceInventory:
    """What the device says it is: checked against the fabric before it is programmed."""

    kind: str  # "OCS", or what the device calls itself when it is not one
    a_ports: int
    b_ports: int
    vendor: str = ""
    model: str = ""


@dataclass
class DeviceStats:
    apply_calls: int = 0
    batches_applied: int = 0
    batches_replayed: int = 0
    batches_failed: int = 0
    edits: int = 0  # device transactions / edit-configs sent
    planned_unread: int = 0  # batches planned on the table last known, without a read
    replans: int = 0  # of those, refused by the device (the table had moved) and re-read
    stale_batches_refused: int = 0  # an older fence token than the device had seen


class DeviceSwitch(ABC):
    """One OCS behind its own management interface, answering like a switch agent."""

    driver_name = "device"
    # the device refuses an edit whose deletes are missing or whose makes find a port
    # taken, atomically (see the module's doc): its batches may skip the read
    guarded_edits = False
    # the device keeps each lease's highest fence token and refuses an older one in the
    # same step as the write (SONiC: a CONFIG_DB table its scripts check); a device that
    # cannot is not fenced (NETCONF: docs/faults.md)
    fenced = False

    def __init__(
        self,
        fabric: Fabric,
        device: SouthboundDevice,
        address: str,
        *,
        settle_timeout_s: float = 30.0,
        keys_kept: int = 1024,
    ):
        self.fabric = fabric
        self.device = device
        self.address = address
        self.sides = PortSides.of(fabric, device)
        self.settle_timeout_s = settle_timeout_s
        self.stats = DeviceStats()
        self._lock = asyncio.Lock()
        self._keys: KeptBatches[bytes, pb.ApplyBatchResponse] = KeptBatches(keys_kept)
        # (boot id, table) as this driver last read or wrote it; None: read before a batch
        self._known: tuple[str, dict[int, int]] | None = None
        self._batches_begun = 0  # a read records `_known` only if no batch ran meanwhile
        self._batch_boot = ""  # the boot id the batch under way was planned on

    @property
    def id(self) -> str:
        return self.device.id

    # -- what a device implements -------------------------------------------------------

    @abstractmethod
    async def inventory(self) -> DeviceInventory:
        """The device's kind and port counts (raises DeviceFailure when unreachable)."""

    @abstractmethod
    async def read_table(self) -> tuple[dict[int, int], str]:
        """(port -> peer both ways, boot id) as the device holds them now."""

    async def begin(self, batch: pb.ApplyBatchRequest) -> tuple[dict[int, int], str]:
        """What the batch is planned on: (port -> peer both ways, boot id), read under the
        batch's lock. A device may prepare its edit here too (SONiC: WATCH the keys the
        batch touches before it reads them); `end` follows, edited or not."""
        return await self.read_table()

    async def end(self) -> None:  # noqa: B027 (a hook: most devices need nothing)
        """After a batch began, whatever happened (SONiC: drop an unused WATCH)."""

    @abstractmethod
    async def edit(
        self,
        edit: Plan,
        boot_id: str,
        version: int | None,
        *,
        unread: bool = False,
        fence: Fence | None = None,
    ) -> None:
        """Apply one edit (deletes before adds) and wait until its ports settled.
        `version`: refuse (DeviceFailure VERSION_MISMATCH) if the table moved since it was
        read at that version (None: no guard). `unread` (devices with `guarded_edits`):
        planned on the table last known, not read; the device must find every delete and
        every make's ports free, else raise TableMoved having applied nothing. `fence`
        (devices that are `fenced`): refuse (`stale_lease`) if the device has seen a
        newer token of its lease, having applied nothing; else keep it. Raises
        DeviceFailure."""

    async def keep_fence(self, fence: Fence) -> None:  # noqa: B027 (fenced devices only)
        """Record `fence` for a batch that moves nothing on this device (refusing it as
        `edit` would when it is older), so that a late batch of an older holder of the
        lease is still refused here."""

    def stale_lease(self, fence: Fence, seen: int) -> DeviceFailure:
        """The refusal of a batch whose fence is older than one the device has seen."""
        self.stats.stale_batches_refused += 1
        return DeviceFailure(
            FailedPrecondition(
                f"lease {fence.lease_id}",
                f"has a newer holder on switch {self.id} (token {seen}) than this batch's "
                f"({fence.token}): nothing applied",
                reason="STALE_LEASE",
            )
        )

    async def _read_known(self) -> tuple[dict[int, int], str]:
        """read_table, remembered as the table last known if no batch ran meanwhile."""
        begun, idle = self._batches_begun, not self._lock.locked()
        table, boot = await self.read_table()
        if idle and begun == self._batches_begun and not self._lock.locked():
            self._known = (boot, dict(table))
        return table, boot

    async def port_states(self) -> dict[int, tuple[int, int | None]]:
        """Lightpath port -> (pb.PortState, peer) for GetPortStatus (default: from the table)."""
        table, _ = await self.read_table()
        return {
            p: (pb.PORT_STATE_CONNECTED if p in table else pb.PORT_STATE_DARK, table.get(p))
            for p in range(self.sides.used)
        }

    @abstractmethod
    async def close(self) -> None:
        """Drop the connection to the device."""

    def settling_time_s(self) -> float:
        return 0.0

    # -- the stub interface (what AgentSwitchDriver and SwitchReconciler call) ----------

    async def Describe(
        self, request: pb.DescribeSwitchRequest, timeout: float | None = None
    ) -> pb.SwitchDescription:
        async def run() -> pb.SwitchDescription:
            self._check_id(request.switch_id)
            inv = await self.inventory()
            table, boot = await self._read_known()
            kind = pb.SWITCH_KIND_OCS if inv.kind == "OCS" else pb.SWITCH_KIND_UNSPECIFIED
            settle = duration_pb2.Duration()
            settle.FromNanoseconds(round(self.settling_time_s() * 1e9))
            return pb.SwitchDescription(
                switch_id=self.id,
                kind=kind,
                # the Lightpath ports this device can serve: its A side as first ends, its
                # B side as second ends (a device with fewer than the fabric needs answers
                # fewer, and the manager refuses it)
                ports=_served(self.sides, inv),
                boot_id=boot,
                version=digest_version(table),
                settling_time=settle,
                vendor=inv.vendor,
                model=inv.model,
            )

        return await self._call(run(), timeout)

    async def GetCrossConnects(
        self, request: pb.GetCrossConnectsRequest, timeout: float | None = None
    ) -> pb.OpticalSwitchState:
        async def run() -> pb.OpticalSwitchState:
            self._check_id(request.switch_id)
            table, boot = await self._read_known()
            return pb.OpticalSwitchState(
                switch_id=self.id,
                boot_id=boot,
                version=digest_version(table),
                cross_connects=[pb.PortPair(port_a=p, port_b=q) for p, q in pairs_of(table)],
            )

        return await self._call(run(), timeout)

    async def GetPortStatus(
        self, request: pb.GetPortStatusRequest, timeout: float | None = None
    ) -> pb.PortStatusList:
        async def run() -> pb.PortStatusList:
            self._check_id(request.switch_id)
            table, boot = await self.read_table()
            states = await self.port_states()
            out = pb.PortStatusList(switch_id=self.id, boot_id=boot, version=digest_version(table))
            for port, (state, peer) in sorted(states.items()):
                st = out.ports.add(port=port, state=state)
                if peer is not None:
                    st.peer = peer
            return out

        return await self._call(run(), timeout)

    async def ApplyBatches(self, request: pb.ApplyBatchesRequest, timeout: float | None = None):
        # one device per adapter: the driver sends ApplyBatch (as to an agent without it)
        raise _unimplemented()

    async def ApplyBatch(
        self, request: pb.ApplyBatchRequest, timeout: float | None = None
    ) -> pb.ApplyBatchResponse:
        self.stats.apply_calls += 1
        try:
            self._check_id(request.switch_id)
            self._validate(request)
        except LightpathError as err:
            self.stats.batches_failed += 1
            raise _rpc_error(err, self._meta((0, 0), "", None)) from None
        kept = self._keys.get(request.batch_id)
        if kept is not None:
            if kept[0] != _without_id(request):
                self.stats.batches_failed += 1
                reused = InvalidArgument(
                    "batch_id",
                    f"{request.batch_id!r} was used for another batch on {self.id}: a key "
                    "names one batch; choose a new one",
                    reason="BATCH_ID_REUSED",
                )
                raise _rpc_error(reused, self._meta((0, 0), "", None))
            self.stats.batches_replayed += 1
            reply = await self._wait(kept[1], timeout)
            out = pb.ApplyBatchResponse()
            out.CopyFrom(reply)
            out.replayed = True
            return out
        future = self._keys.start(
            request.batch_id, _without_id(request), self._run(request), self._failed
        )
        return await self._wait(future, timeout)

    def _failed(self) -> None:
        self.stats.batches_failed += 1

    # -- inside ---------------------------------------------------------------------------

    async def _run(self, request: pb.ApplyBatchRequest) -> pb.ApplyBatchResponse:
        """The batch, start to end (not bound to its caller: a caller that went away asks
        again under the same key)."""
        async with self._lock:
            self._batches_begun += 1
            known, self._known = self._known, None  # kept again only if the batch succeeds
            self._batch_boot = ""
            counts = (len(request.disconnect), len(request.connect))
            try:
                async with asyncio.timeout(self.settle_timeout_s):
                    edit = await self._unread(request, known)
                    if edit is None:
                        edit = await self._read_and_edit(request)
                    boot = self._batch_boot
                    version = digest_version(edit.after)
                    self._known = (boot, edit.after)
            except DeviceFailure as failure:
                if failure.error.reason == "SWITCH_UNREACHABLE" and failure.progress == (0, 0):
                    # out of reach before anything was sent: not accepted, so not kept (the
                    # same key later is a new attempt; docs/ocs_southbound.md, Idempotency)
                    self._keys.forget_unfinished(request.batch_id)
                raise _rpc_error(
                    failure.error, self._meta(failure.progress, self._batch_boot, None)
                ) from None
            except TimeoutError:
                late = DeadlineExceeded(
                    f"switch {self.id} did not settle within {self.settle_timeout_s:g} s"
                )
                raise _rpc_error(late, {"switch_id": self.id}) from None
            finally:
                await self.end()
            return pb.ApplyBatchResponse(
                switch_id=self.id,
                batch_id=request.batch_id,
                boot_id=boot,
                version=version,
                applied=pb.BatchProgress(disconnects=counts[0], connects=counts[1]),
            )

    async def _unread(
        self, request: pb.ApplyBatchRequest, known: tuple[str, dict[int, int]] | None
    ) -> Plan | None:
        """The batch planned on the table last known and applied without a read, when the
        device guards that (see the module's doc): the plan, or None when it cannot be
        (nothing known, a version or another boot expected, an operation the table says
        moves nothing) or the device found the table moved."""
        if (
            not self.guarded_edits
            or known is None
            or request.HasField("expect_version")
            or (request.expect_boot_id and request.expect_boot_id != known[0])
            or not moves_all(known[1], request)
        ):
            return None
        boot, held = known
        edit = plan(self.sides, held, request)
        if edit.empty:  # a batch of nothing: answered from a read, as ever
            return None
        self._batch_boot = boot
        self.stats.planned_unread += 1
        self.stats.edits += 1
        try:
            await self.edit(edit, boot, None, unread=True, fence=self._fence_of(request))
        except TableMoved:
            self.stats.replans += 1
            return None
        self.stats.batches_applied += 1
        return edit

    async def _read_and_edit(self, request: pb.ApplyBatchRequest) -> Plan:
        """The batch planned on the table read now (under `begin`)."""
        held, boot = await self.begin(request)
        self._batch_boot = boot
        version = digest_version(held)
        if (request.expect_boot_id and request.expect_boot_id != boot) or (
            request.HasField("expect_version") and request.expect_version != version
        ):
            err = FailedPrecondition(
                f"switch {self.id}",
                f"is at boot {boot} version {version}, not the expected boot "
                f"{request.expect_boot_id or '(any)'} version "
                f"{request.expect_version if request.HasField('expect_version') else '(any)'}"
                ": read its state again",
                reason="VERSION_MISMATCH",
            )
            raise DeviceFailure(err)
        edit = plan(self.sides, held, request)
        fence = self._fence_of(request)
        if not edit.empty:
            self.stats.edits += 1
            guard = version if request.HasField("expect_version") else None
            await self.edit(edit, boot, guard, fence=fence)
            self.stats.batches_applied += 1
        elif fence is not None:
            await self.keep_fence(fence)
        return edit

    def _fence_of(self, request: pb.ApplyBatchRequest) -> Fence | None:
        if not self.fenced or not request.HasField("fence") or not request.fence.lease_id:
            return None
        return request.fence

    async def _wait(
        self, future: asyncio.Future[pb.ApplyBatchResponse], timeout: float | None
    ) -> pb.ApplyBatchResponse:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            err = DeadlineExceeded(
                f"switch {self.id} did not answer within {timeout:g} s (the batch goes on; "
                "ask again with the same batch_id)"
            )
            raise _rpc_error(err, {}) from None  # no counts: unknown

    async def _call(self, coro, timeout: float | None):
        try:
            async with asyncio.timeout(timeout):
                return await coro
        except DeviceFailure as failure:
            raise _rpc_error(failure.error, {"switch_id": self.id}) from None
        except LightpathError as err:
            raise _rpc_error(err, {"switch_id": self.id}) from None
        except TimeoutError:
            raise _rpc_error(
                DeadlineExceeded(f"switch {self.id} did not answer within {timeout:g} s"), {}
            ) from None

    def _check_id(self, switch_id: str) -> None:
        if switch_id and switch_id != self.id:
            raise NotFound("switch", switch_id, hint=f"this {self.driver_name} switch is {self.id}")

    def _validate(self, req: pb.ApplyBatchRequest) -> None:
        bad: list[FieldViolation] = []
        if not req.batch_id or len(req.batch_id) > 128 or not set(req.batch_id) <= BATCH_ID_CHARS:
            bad.append(
                FieldViolation("batch_id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
            )
        if req.set_outputs:
            bad.append(FieldViolation("set_outputs", f"{self.id} is an OCS: it has no 1xK outputs"))
        oriented = self.sides.oriented
        ports: list[int] = []
        for name, pairs in (("disconnect", req.disconnect), ("connect", req.connect)):
            for i, x in enumerate(pairs):
                p, q = x.port_a, x.port_b
                if name == "connect":
                    ports += (p, q)
                try:
                    oriented(p, q)
                except ValueError as exc:
                    bad.append(FieldViolation(f"{name}[{i}]", str(exc)))
        seen: dict[int, int] = {}
        for i, x in enumerate(req.connect if len(set(ports)) < len(ports) else ()):
            for port in (x.port_a, x.port_b):
                if port in seen and seen[port] != i:
                    bad.append(
                        FieldViolation(
                            f"connect[{i}]",
                            f"port {port} is also in connect[{seen[port]}]: a port joins one peer",
                        )
                    )
                seen[port] = i
        if bad:
            raise InvalidArgument.of(bad[:20], reason="INVALID_BATCH")

    def _meta(
        self, progress: tuple[int, int] | None, boot: str, version: int | None
    ) -> dict[str, str]:
        if progress is None:  # unknown: no counts, so the caller counts the switch as touched
            return {"switch_id": self.id}
        meta = {
            "switch_id": self.id,
            "applied_disconnects": str(progress[0]),
            "applied_outputs": "0",
            "applied_connects": str(progress[1]),
            "boot_id": boot,
        }
        if version is not None:
            meta["version"] = str(version)
        return meta


def _served(sides: PortSides, inv: DeviceInventory) -> int:
    """Lightpath ports (0 .. n-1) a device with `inv`'s sides serves for an OCS laid out as
    `sides`: all the fabric cables if both sides are big enough, else only its A side."""
    if inv.a_ports >= sides.first_ends and inv.b_ports >= sides.second_ends:
        return sides.used
    return min(inv.a_ports, sides.first_ends)


def _without_id(req: pb.ApplyBatchRequest) -> bytes:
    body = pb.ApplyBatchRequest()
    body.CopyFrom(req)
    body.batch_id = ""
    body.switch_id = ""
    body.ClearField("timeout")  # how long a caller waits is not the batch
    return body.SerializeToString(deterministic=True)


def _rpc_error(err: LightpathError, metadata: dict[str, str] | None = None) -> grpc.aio.AioRpcError:
    """`err` as the AioRpcError a switch agent's answer would have raised."""
    if metadata:
        err.metadata = {**err.metadata, **metadata}
    status = to_status_proto(err)
    code = grpc.StatusCode[err.code]
    trailers = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, details=err.message)


def _unimplemented() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="a device switch takes one ApplyBatch at a time",
    )


def unreachable(switch_id: str, what: str, exc: BaseException) -> DeviceFailure:
    return DeviceFailure(
        Unavailable(
            f"switch {switch_id} does not answer its management interface ({what}: {exc})",
            reason="SWITCH_UNREACHABLE",
        )
    )


def rejected(switch_id: str, why: str) -> DeviceFailure:
    return DeviceFailure(
        Aborted(
            f"switch {switch_id} refused the batch: {why}; nothing was applied",
            reason="BATCH_REJECTED",
        )
    )


def port_names(sides: PortSides, ports: Iterable[int]) -> list[str]:
    return [f"{i}{s}" for s, i in (sides.side(p) for p in ports)]


__all__ = [
    "DeviceFailure",
    "DeviceInventory",
    "DeviceSwitch",
    "Plan",
    "PortSides",
    "TableMoved",
    "digest_version",
    "plan",
    "rejected",
    "unreachable",
]
