"""Simulated optical switches with the southbound's semantics (optical_switch.proto).

A `SimulatedSwitch` holds what a real one does: its table (OCS: port -> peer;
bank of 1xK switches: input -> output), a version bumped by every batch that
took effect, and a boot id that changes when it restarts with empty tables.
`apply` follows the contract of docs/ocs_southbound.md:

* validate the whole batch first (nothing applied on a bad one);
* idempotency: the outcome of every batch id is kept (the last N); a repeat
  answers it, waiting if the first call is still settling;
* one batch at a time per switch; disconnects, then outputs, then connects,
  each absolute; the table changes at once, the answer comes after the
  settling time (mirrors moving) and after the state file has the change;
* a batch runs to its end even if its caller goes away (its outcome is kept
  for a retry under the same id);
* fencing (issue 32): a batch under a lease (`fence`: lease id, token) is refused,
  nothing applied, when the switch has seen a higher token for that lease — checked
  when the batch's turn comes, so a batch queued before a newer holder's is still
  ordered before it;
* faults: unreachable, slow, reject, apply part, restart empty;
* timing (`SwitchTiming`, issue 34): how long a batch settles depends on how many
  ports it moves, and a batch that connects a port still connected elsewhere (adds
  before deletes) costs the switch a conflict resolution; ports read SETTLING
  meanwhile, and `power_dbm` is what a port's power monitor would read.

Errors are LightpathErrors whose metadata says what took effect
(`applied_disconnects`, `applied_outputs`, `applied_connects`, `version`,
`boot_id`), which the server factory sends as google.rpc.ErrorInfo.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from lightpath.domain.southbound import OCS, SouthboundDevice
from lightpath.domain.switch_timing import DARK_DBM, SwitchTiming, power_dbm
from lightpath.errors import (
    Aborted,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LightpathError,
    Unavailable,
)
from lightpath_services.common.idempotency import KeptBatches
from lightpath_services.switch_agent.faults import Faults

Pair = tuple[int, int]
Output = tuple[int, int | None]

BATCH_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
MAX_BATCH_ID = 128
# Leases whose highest token a switch remembers (the oldest forgotten first): far more
# than the slices whose changes can be in flight at once.
FENCES_KEPT = 65_536


def new_boot_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Batch:
    disconnect: tuple[Pair, ...] = ()
    outputs: tuple[Output, ...] = ()
    connect: tuple[Pair, ...] = ()

    @property
    def size(self) -> int:
        return len(self.disconnect) + len(self.outputs) + len(self.connect)

    def fingerprint(self) -> str:
        return hashlib.sha256(
            repr((self.disconnect, self.outputs, self.connect)).encode()
        ).hexdigest()


@dataclass(frozen=True)
class Progress:
    disconnects: int = 0
    outputs: int = 0
    connects: int = 0

    @property
    def total(self) -> int:
        return self.disconnects + self.outputs + self.connects


@dataclass(frozen=True)
class Applied:
    """A batch's successful outcome."""

    progress: Progress
    version: int
    boot_id: str


@dataclass
class Stats:
    apply_calls: int = 0
    batches_applied: int = 0
    batches_replayed: int = 0
    batches_failed: int = 0
    operations_applied: int = 0
    restarts: int = 0
    stale_batches_refused: int = 0


@dataclass
class SimulatedSwitch:
    device: SouthboundDevice
    boot_id: str = field(default_factory=new_boot_id)
    version: int = 0
    table: dict[int, int] = field(default_factory=dict)  # OCS: port -> peer (both ways)
    outputs: dict[int, int] = field(default_factory=dict)  # bank: input -> output
    faults: Faults = field(default_factory=Faults)
    stats: Stats = field(default_factory=Stats)
    settling: set[int] = field(default_factory=set)
    conflicts: int = 0  # of the batch being applied (SwitchTiming)
    last_settle_s: float = 0.0  # what the last batch's settling took (without faults)
    keys_kept: int = 1024
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _reboot: asyncio.Event = field(default_factory=asyncio.Event)  # set when this boot ends
    _keys: KeptBatches[str, Applied] = field(init=False)
    # lease id -> the highest fence token seen (fencing)
    fences: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self._keys = KeptBatches(self.keys_kept)

    @property
    def id(self) -> str:
        return self.device.id

    @property
    def is_ocs(self) -> bool:
        return self.device.kind == OCS

    # -- reads -----------------------------------------------------------------------

    def check_reachable(self) -> None:
        if self.faults.unreachable:
            raise Unavailable(
                f"switch {self.id} does not answer its management interface",
                reason="SWITCH_UNREACHABLE",
                metadata=self._meta(Progress()),
            )

    def pairs(self) -> list[Pair]:
        return sorted((p, q) for p, q in self.table.items() if p < q)

    def _failed(self) -> None:
        self.stats.batches_failed += 1

    # -- restart ---------------------------------------------------------------------

    def restart_empty(self) -> None:
        """Power cycle: empty tables, version 0, a new boot id, every kept batch id forgotten.
        A batch settling now fails (SWITCH_RESTARTED) when its settling ends."""
        self._reboot.set()
        self._reboot = asyncio.Event()
        self.boot_id = new_boot_id()
        self.version = 0
        self.table.clear()
        self.outputs.clear()
        self.settling.clear()
        self._keys.clear()
        self.stats.restarts += 1

    # -- ApplyBatch --------------------------------------------------------------------

    async def apply(
        self,
        batch_id: str,
        batch: Batch,
        *,
        settle_s: float | SwitchTiming,
        persist: Callable[[], Awaitable[None]],
        expect_boot_id: str = "",
        expect_version: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> tuple[Applied, bool]:
        """Apply `batch` under `batch_id`: (outcome, replayed)."""
        self.stats.apply_calls += 1
        try:
            self.check_reachable()
            self._validate(batch_id, batch)
        except LightpathError:
            self.stats.batches_failed += 1
            raise
        fingerprint = batch.fingerprint()
        kept = self._keys.get(batch_id)
        if kept is not None:
            if kept[0] != fingerprint:
                self.stats.batches_failed += 1
                raise InvalidArgument(
                    "batch_id",
                    f"{batch_id!r} was used for another batch on {self.id}: "
                    "a key names one batch; choose a new one",
                    reason="BATCH_ID_REUSED",
                    metadata=self._meta(Progress()),
                )
            self.stats.batches_replayed += 1
            return await asyncio.shield(kept[1]), True
        future = self._keys.start(
            batch_id,
            fingerprint,
            self._run(batch, settle_s, persist, expect_boot_id, expect_version, fence),
            self._failed,
        )
        # The batch runs to its end even if this call is cancelled (its caller went away).
        return await asyncio.shield(future), False

    async def _run(
        self,
        batch: Batch,
        settle_s: float | SwitchTiming,
        persist: Callable[[], Awaitable[None]],
        expect_boot_id: str,
        expect_version: int | None,
        fence: tuple[str, int] | None = None,
    ) -> Applied:
        async with self._lock:
            if fence is not None:
                self._check_fence(*fence)
            boot, reboot = self.boot_id, self._reboot
            if (expect_boot_id and expect_boot_id != boot) or (
                expect_version is not None and expect_version != self.version
            ):
                stale = FailedPrecondition(
                    f"switch {self.id}",
                    f"is at boot {boot} version {self.version}, not the expected boot "
                    f"{expect_boot_id or '(any)'} version "
                    f"{'(any)' if expect_version is None else expect_version}: "
                    "read its state again",
                    reason="VERSION_MISMATCH",
                )
                stale.metadata = self._meta(Progress())
                raise stale
            if self.faults.reject_batches > 0:
                self.faults.reject_batches -= 1
                raise Aborted(
                    f"switch {self.id} refused the batch (injected fault); nothing was applied",
                    reason="BATCH_REJECTED",
                    metadata=self._meta(Progress()),
                )
            limit = batch.size
            partial = self.faults.partial_batches > 0 and batch.size > 0
            if partial:
                self.faults.partial_batches -= 1
                limit = batch.size // 2
            progress = self._apply_ops(batch, limit)
            if progress.total:
                self.version += 1
                self.stats.batches_applied += 1
                self.stats.operations_applied += progress.total
            await persist()
            timing = (
                settle_s
                if isinstance(settle_s, SwitchTiming)
                else SwitchTiming.fixed(settle_s * 1000)
            )
            moved = len(self.settling)
            delay = timing.settle_s(moved, self.device.ports, self.conflicts)
            self.last_settle_s = delay
            delay += self.faults.extra_delay_s
            if delay > 0 and progress.total:
                # mirrors moving; a restart (power cycle) ends it at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reboot.wait(), delay)
            if self.boot_id != boot:
                raise Unavailable(
                    f"switch {self.id} restarted with empty tables while the batch settled; "
                    "none of it remains",
                    reason="SWITCH_RESTARTED",
                    metadata=self._meta(Progress()),
                )
            self.settling.clear()
            if partial:
                raise Unavailable(
                    f"switch {self.id} applied {progress.total} of the batch's {batch.size} "
                    "operations, then failed (injected fault)",
                    reason="PARTIALLY_APPLIED",
                    metadata=self._meta(progress),
                )
            return Applied(progress, self.version, boot)

    def _check_fence(self, lease_id: str, token: int) -> None:
        """Refuse a batch under an older token of `lease_id` than seen; else remember it."""
        seen = self.fences.get(lease_id, 0)
        if token < seen:
            self.stats.stale_batches_refused += 1
            refused = FailedPrecondition(
                f"lease {lease_id}",
                f"has a newer holder on switch {self.id} (token {seen}) than this batch's "
                f"({token}): nothing applied",
                reason="STALE_LEASE",
            )
            refused.metadata = self._meta(Progress())
            raise refused
        self.fences[lease_id] = token
        self.fences.move_to_end(lease_id)
        while len(self.fences) > FENCES_KEPT:
            self.fences.popitem(last=False)

    def _apply_ops(self, batch: Batch, limit: int) -> Progress:
        self.conflicts = 0
        done = [0, 0, 0]
        budget = limit
        for p, q in batch.disconnect:
            if budget == 0:
                break
            if self.table.get(p) == q:
                del self.table[p]
                del self.table[q]
                self.settling.update((p, q))
            done[0] += 1
            budget -= 1
        for i, out in batch.outputs:
            if budget == 0:
                break
            if out is None:
                self.outputs.pop(i, None)
            else:
                self.outputs[i] = out
            self.settling.add(i)
            done[1] += 1
            budget -= 1
        for p, q in batch.connect:
            if budget == 0:
                break
            for port in (p, q):
                old = self.table.pop(port, None)
                if old is not None and old not in (p, q):
                    self.table.pop(old, None)
                    self.settling.add(old)
                    self.conflicts += 1  # still connected: the switch resolves it
            self.table[p] = q
            self.table[q] = p
            self.settling.update((p, q))
            done[2] += 1
            budget -= 1
        return Progress(*done)

    def _validate(self, batch_id: str, batch: Batch) -> None:
        bad: list[FieldViolation] = []
        if not batch_id or len(batch_id) > MAX_BATCH_ID or not set(batch_id) <= BATCH_ID_CHARS:
            bad.append(
                FieldViolation(
                    "batch_id", f"must be 1-{MAX_BATCH_ID} characters of A-Z a-z 0-9 . _ : -"
                )
            )
        n = self.device.ports
        if self.is_ocs:
            if batch.outputs:
                bad.append(
                    FieldViolation("set_outputs", f"{self.id} is an OCS: it has no 1xK outputs")
                )
            for name, pairs in (("disconnect", batch.disconnect), ("connect", batch.connect)):
                bad += _check_pairs(name, pairs, n)
            seen: dict[int, int] = {}
            for i, (p, q) in enumerate(batch.connect):
                for port in (p, q):
                    if port in seen and seen[port] != i:
                        bad.append(
                            FieldViolation(
                                f"connect[{i}]",
                                f"port {port} is also in connect[{seen[port]}]: a port joins "
                                "one peer",
                            )
                        )
                    seen[port] = i
        else:
            if batch.disconnect or batch.connect:
                bad.append(
                    FieldViolation(
                        "connect",
                        f"{self.id} is a bank of 1xK switches: it has no cross-connects",
                    )
                )
            k = self.device.outputs
            for i, (inp, out) in enumerate(batch.outputs):
                if inp >= n:
                    bad.append(
                        FieldViolation(f"set_outputs[{i}].input", f"must be < {n} ({self.id})")
                    )
                if out is not None and out >= k:
                    bad.append(FieldViolation(f"set_outputs[{i}].output", f"must be < K={k}"))
        if bad:
            raise InvalidArgument.of(
                bad[:20], reason="INVALID_BATCH", metadata=self._meta(Progress())
            )

    def _meta(self, progress: Progress) -> dict[str, str]:
        return {
            "switch_id": self.id,
            "applied_disconnects": str(progress.disconnects),
            "applied_outputs": str(progress.outputs),
            "applied_connects": str(progress.connects),
            "version": str(self.version),
            "boot_id": self.boot_id,
        }


def _check_pairs(name: str, pairs: Sequence[Pair], ports: int) -> list[FieldViolation]:
    out = []
    for i, (p, q) in enumerate(pairs):
        if p >= ports or q >= ports:
            out.append(FieldViolation(f"{name}[{i}]", f"ports must be < {ports} (the radix)"))
        elif p == q:
            out.append(FieldViolation(f"{name}[{i}]", f"port {p} cannot connect to itself"))
    return out


__all__ = ["DARK_DBM", "Batch", "SimulatedSwitch", "SwitchTiming", "power_dbm"]
