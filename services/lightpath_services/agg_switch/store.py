"""Redis persistence of agg_switch (X-4): everything under one tree's hash tag
``lp:{agg:<tree>}:…``, so a tree's keys share a Cluster slot and the Lua
transactions (lightpath_services.common.txn, this store's checks and ops in store.lua) may touch
them together.

    topology            hash  json, version, defined_at          (AG-1)
    endpoints           hash  node → host:port registered at start
    cmd:<id>            hash  spec, digest, state, created_at, finished_at, failure
    cmd:<id>:holds      hash  switch → slot-hold report (JSON)   (AG-13)
    cmd:<id>:missing    set   nodes that never arrived (FAILED)
    aborts              stream command, reason, code, origin: failures every
                        switch of the tree applies at once (AbortCommand, a
                        refused chunk not corrected), not at the deadline
    commands            zset  id by creation time (listing)
    running             zset  id by deadline (no topology change while > 0)
    lateness:<id>       hash  compute node → seconds late at its switch (AG-9)
    history             zset  id by finish time
    load                hash  node → bytes/s (AG-10 least load)
    model:<m>           hash  dtype, length, version, data (binary) (AG-12)
    model:<m>:lock      string the command updating the model

Data never goes through Redis: only commands, reports and parameters do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from lightpath.aggregation.maths import DType
from lightpath.errors import Aborted, FailedPrecondition, NotFound
from lightpath_services.agg_switch.command import CommandSpec, CommandState
from lightpath_services.agg_switch.switch import CommandReport
from lightpath_services.agg_switch.topology import Topology
from lightpath_services.common.keys import tree_key
from lightpath_services.common.txn import Conflict, Program, Txn

if TYPE_CHECKING:
    import numpy as np

# A command is RUNNING until a switch says otherwise; one that outlived its
# deadline by this much with nobody saying so (every switch gone) is failed on read.
STALE_GRACE_S = 5.0
FINISHED_TTL_S = 7 * 24 * 3600
HISTORY_KEEP = 1000
# How many ids a tenant's listing reads at a time while it skips other tenants' commands.
LIST_SCAN = 64

ABORTS_MAXLEN = 1000
PROGRAM = Program(
    "lightpath_services.agg_switch",
    "store.lua",
    {
        "RUNNING": CommandState.RUNNING.value,
        "FAILED": CommandState.FAILED.value,
        "FINISHED_TTL_S": FINISHED_TTL_S,
        "ABORTS_MAXLEN": ABORTS_MAXLEN,
    },
)


@dataclass
class CommandRecord:
    spec: CommandSpec
    state: CommandState
    digest: str = ""
    finished_at: float = 0.0
    failure: str = ""
    missing: list[str] = field(default_factory=list)
    # How it failed: DEADLINE_EXCEEDED, ABORTED, CHUNK_NOT_CORRECTED.
    failure_reason: str = ""
    holds: dict[str, dict[str, Any]] = field(default_factory=dict)


def report_json(report: CommandReport) -> dict[str, Any]:
    return {
        "chunks": len(report.holds_ms),
        "max_ms": report.max_ms,
        "mean_ms": report.mean_ms,
        "total_ms": report.total_ms,
        "timed_out_chunks": report.timed_out_chunks,
        "fallback_chunks": report.fallback_chunks,
        "timeout_nodes": sorted(report.timeout_nodes),
        "bypass_entries_created": report.bypass_created,
        "duplicates": report.duplicates,
        "waited_ms": report.waited_ms,
        "failed": report.failed,
    }


class AggStore:
    def __init__(self, redis: aioredis.Redis, binary: aioredis.Redis | None = None):
        # Any: redis-py's annotations do not know decode_responses.
        self.r: Any = redis
        self.b: Any = binary or redis
        self._script = PROGRAM.bind(redis)

    # -- topology (AG-1) ---------------------------------------------------------

    async def topology(self, tree_id: str) -> Topology | None:
        raw = await self.r.hmget(tree_key(tree_id, "topology"), "json", "version", "defined_at")
        if raw[0] is None:
            return None
        data = json.loads(raw[0])
        data["version"] = int(raw[1])
        data["defined_at"] = float(raw[2])
        return Topology.from_json(data)

    async def define_topology(self, topology: Topology, now: float) -> int:
        """Store `topology`; refused while a command of the tree runs. Returns the version."""
        topo, running = (
            tree_key(topology.tree_id, "topology"),
            tree_key(topology.tree_id, "running"),
        )
        stale = now - STALE_GRACE_S
        t = Txn()
        t.check("idle", t.k(running), stale)
        t.op("stale", t.k(running), stale)
        t.hincr(topo, "version", 1)
        t.hset(topo, {"json": json.dumps(topology.to_json()), "defined_at": now})
        t.read("HGET", topo, "version")
        try:
            done = await self._script.commit(t)
        except Conflict as c:
            raise FailedPrecondition(
                f"tree {topology.tree_id}",
                f"command {c.value} is running; the topology changes once no command runs",
                reason=c.reason,
            ) from None
        return int(done.reads[0])

    async def register_endpoint(self, tree_id: str, node_id: str, address: str) -> None:
        await self.r.hset(tree_key(tree_id, "endpoints"), node_id, address)

    async def endpoints(self, tree_id: str) -> dict[str, str]:
        return await self.r.hgetall(tree_key(tree_id, "endpoints"))

    # -- commands (AG-2) ---------------------------------------------------------

    def _cmd(self, tree_id: str, command_id: str, *parts: str) -> str:
        return tree_key(tree_id, "cmd", command_id, *parts)

    async def start_command(self, spec: CommandSpec, digest: str) -> tuple[CommandSpec, bool]:
        """Create the command, or return the existing one for a retry of the same request."""
        t = spec.tree_id
        lock = tree_key(t, "model", spec.ps_model or "-", "lock")
        ttl_ms = max(1, int((spec.deadline_at - spec.created_at + STALE_GRACE_S) * 1000))
        cmd = self._cmd(t, spec.command_id)
        txn = Txn()
        txn.expect(cmd, "digest", [""], reason="COMMAND_EXISTS")
        txn.expect(tree_key(t, "topology"), "version", [str(spec.topology_version)], reason="STALE")
        if spec.ps_model:
            txn.check("lock", txn.k(lock), spec.command_id)
            txn.set_px(lock, spec.command_id, ttl_ms)
        txn.hset(
            cmd,
            {
                "spec": json.dumps(spec.to_json()),
                "digest": digest,
                "state": CommandState.RUNNING.value,
                "created_at": spec.created_at,
            },
        )
        txn.zadd(tree_key(t, "running"), spec.deadline_at, spec.command_id)
        txn.zadd(tree_key(t, "commands"), spec.created_at, spec.command_id)
        try:
            await self._script.commit(txn)
            return spec, True
        except Conflict as c:
            refused = c
        if refused.reason == "COMMAND_EXISTS":
            if refused.value != digest:
                raise FailedPrecondition(
                    f"command {spec.command_id}",
                    "exists with different parameters; choose a new command id",
                    reason="COMMAND_EXISTS",
                )
            record = await self.command(t, spec.command_id)
            assert record is not None
            return record.spec, False
        if refused.reason == "STALE" and not refused.value:
            raise FailedPrecondition(
                f"tree {t}", "has no topology; DefineTopology first", reason="NO_TOPOLOGY"
            )
        if refused.reason == "STALE":
            raise Aborted("the topology changed while the command was planned; retry")
        raise FailedPrecondition(
            f"model {spec.ps_model}",
            f"command {refused.value} is updating it; one command updates a model at a time",
            reason="MODEL_BUSY",
        )

    async def command(
        self, tree_id: str, command_id: str, *, settle: bool = True
    ) -> CommandRecord | None:
        """The command's record; `settle` (the default) first fails one that outlived its
        deadline with no switch saying so. `settle=False` only reads (a caller may still
        be refused it: `settle` the record once it may see it)."""
        key = self._cmd(tree_id, command_id)
        async with self.r.pipeline(transaction=False) as p:
            p.hgetall(key)
            p.hgetall(self._cmd(tree_id, command_id, "holds"))
            p.smembers(self._cmd(tree_id, command_id, "missing"))
            data, holds, missing = await p.execute()
        if not data:
            return None
        spec = CommandSpec.from_json(json.loads(data["spec"]))
        record = CommandRecord(
            spec=spec,
            state=CommandState(data["state"]),
            digest=data.get("digest", ""),
            finished_at=float(data.get("finished_at") or 0.0),
            failure=data.get("failure", ""),
            failure_reason=data.get("failure_reason", ""),
            missing=sorted(missing),
            holds={k: json.loads(v) for k, v in holds.items()},
        )
        return await self.settle(record) if settle else record

    async def settle(self, record: CommandRecord) -> CommandRecord:
        """Fail a RUNNING command that outlived its deadline with no switch saying so."""
        now = time.time()
        spec = record.spec
        if record.state is CommandState.RUNNING and now > spec.deadline_at + STALE_GRACE_S:
            reason = "the deadline passed and no switch reported the command"
            await self.finish_command(
                spec, CommandState.FAILED, now, reason, failure_reason="DEADLINE_EXCEEDED"
            )
            record.state, record.failure, record.finished_at = CommandState.FAILED, reason, now
            record.failure_reason = "DEADLINE_EXCEEDED"
        return record

    async def require_command(self, tree_id: str, command_id: str) -> CommandRecord:
        record = await self.command(tree_id, command_id)
        if record is None:
            raise NotFound("command", command_id, hint=f"no such command in tree {tree_id}")
        return record

    async def list_commands(
        self, tree_id: str, offset: int, limit: int, *, tenant: str | None = None
    ) -> tuple[list[CommandRecord], int | None]:
        """Up to `limit` commands, newest first, from position `offset` of the tree's
        listing, and the position the next page starts at (None: no more). `tenant`:
        only that tenant's commands (the others are not read further, nor settled)."""
        key = tree_key(tree_id, "commands")
        if tenant is None:
            ids = await self.r.zrevrange(key, offset, offset + limit)
            out = []
            for cid in ids[:limit]:
                rec = await self.command(tree_id, cid)
                if rec is not None:
                    out.append(rec)
            return out, offset + limit if len(ids) > limit else None
        out = []
        pos, batch = offset, max(limit + 1, LIST_SCAN)
        while True:
            ids = await self.r.zrevrange(key, pos, pos + batch - 1)
            owners = await self._tenants(tree_id, ids)
            for i, cid in enumerate(ids):
                if owners.get(cid) != tenant:
                    continue
                if len(out) == limit:
                    return out, pos + i
                rec = await self.command(tree_id, cid)
                if rec is not None:
                    out.append(rec)
            if len(ids) < batch:
                return out, None
            pos += len(ids)

    async def _tenants(self, tree_id: str, command_ids: Sequence[str]) -> dict[str, str]:
        """The tenant of each command still stored."""
        if not command_ids:
            return {}
        async with self.r.pipeline(transaction=False) as p:
            for cid in command_ids:
                p.hget(self._cmd(tree_id, cid), "spec")
            specs = await p.execute()
        return {
            cid: json.loads(raw)["tenant"]
            for cid, raw in zip(command_ids, specs, strict=True)
            if raw is not None
        }

    async def finish_command(
        self,
        spec: CommandSpec,
        state: CommandState,
        now: float,
        failure: str = "",
        missing: Sequence[str] = (),
        *,
        failure_reason: str = "",
        spread: bool = False,
        origin: str = "",
    ) -> bool:
        """RUNNING → COMPLETED / FAILED, once (compare-and-set); frees the model lock.
        `spread`: the failure also goes on the tree's aborts stream, in the same
        step, so every switch applies it now (`follow_aborts`)."""
        t = spec.tree_id
        txn = Txn()
        txn.op(
            "finish",
            *(
                txn.k(key)
                for key in (
                    self._cmd(t, spec.command_id),
                    tree_key(t, "running"),
                    tree_key(t, "model", spec.ps_model or "-", "lock"),
                    self._cmd(t, spec.command_id, "missing"),
                    self.aborts_key(t),
                )
            ),
            spec.command_id,
            state.value,
            now,
            failure,
            failure_reason,
            int(spread),
            origin,
            list(missing),
        )
        return bool((await self._script.commit(txn))["moved"])

    @staticmethod
    def aborts_key(tree_id: str) -> str:
        return tree_key(tree_id, "aborts")

    async def aborts_tail(self, tree_id: str) -> str:
        """The id of the last entry of the tree's aborts stream ("0-0": none)."""
        last = await self.r.xrevrange(self.aborts_key(tree_id), count=1)
        return last[0][0] if last else "0-0"

    async def read_aborts(
        self, tree_id: str, after: str, block_ms: int
    ) -> list[tuple[str, dict[str, str]]]:
        """Failures spread after `after`: (entry id, {command, reason, code, origin})."""
        got = await self.r.xread({self.aborts_key(tree_id): after}, block=block_ms, count=100)
        return [(entry_id, fields) for _, entries in got for entry_id, fields in entries]

    async def add_report(self, spec: CommandSpec, report: CommandReport, now: float) -> None:
        """One switch's slot holds (AG-13) and its compute nodes' lateness (AG-9)."""
        t, cid = spec.tree_id, spec.command_id
        async with self.r.pipeline(transaction=True) as p:
            holds = self._cmd(t, cid, "holds")
            p.hset(holds, report.switch_id, json.dumps(report_json(report)))
            p.expire(holds, FINISHED_TTL_S)
            if report.lateness and not report.failed:
                late = tree_key(t, "lateness", cid)
                p.hset(late, mapping={k: repr(v) for k, v in report.lateness.items()})
                p.expire(late, FINISHED_TTL_S)
                p.zadd(tree_key(t, "history"), {cid: now}, nx=True)
                p.zremrangebyrank(tree_key(t, "history"), 0, -HISTORY_KEEP - 1)
            await p.execute()

    async def history(
        self, tree_id: str, limit: int, *, tenant: str | None = None
    ) -> list[tuple[str, float, dict[str, float]]]:
        """(command, finished at, node → lateness s), newest first; `tenant`: the last
        `limit` of that tenant's commands only."""
        key = tree_key(tree_id, "history")
        if tenant is None:
            entries = await self.r.zrevrange(key, 0, limit - 1, withscores=True)
            return await self._lateness(tree_id, entries)
        out: list[tuple[str, float, dict[str, float]]] = []
        pos, batch = 0, max(limit, LIST_SCAN)
        while len(out) < limit:
            entries = await self.r.zrevrange(key, pos, pos + batch - 1, withscores=True)
            owners = await self._tenants(tree_id, [cid for cid, _ in entries])
            mine = [(cid, at) for cid, at in entries if owners.get(cid) == tenant]
            out += (await self._lateness(tree_id, mine))[: limit - len(out)]
            if len(entries) < batch:
                break
            pos += len(entries)
        return out

    async def _lateness(
        self, tree_id: str, entries: Sequence[tuple[str, float]]
    ) -> list[tuple[str, float, dict[str, float]]]:
        async with self.r.pipeline(transaction=False) as p:
            for cid, _ in entries:
                p.hgetall(tree_key(tree_id, "lateness", cid))
            lates = await p.execute()
        return [
            (cid, float(at), {k: float(v) for k, v in late.items()})
            for (cid, at), late in zip(entries, lates, strict=True)
            if late
        ]

    # -- load (AG-10) ------------------------------------------------------------

    async def report_load(self, tree_id: str, node_id: str, bytes_per_s: float) -> None:
        await self.r.hset(tree_key(tree_id, "load"), node_id, repr(float(bytes_per_s)))

    async def loads(self, tree_id: str) -> dict[str, float]:
        return {k: float(v) for k, v in (await self.r.hgetall(tree_key(tree_id, "load"))).items()}

    # -- parameters (AG-12) --------------------------------------------------------

    async def set_parameters(
        self,
        tree_id: str,
        model_id: str,
        dtype: DType,
        data: bytes,
        *,
        tenant: str | None = None,
        owner: str = "",
    ) -> int | None:
        """Store a model's parameters; the new version. The first writer's tenant (""
        for operators) owns the model: a tenant writing another's model gets None and
        nothing is written. `tenant` None: the caller is trusted (an operator, or a
        command, whose tenant `owner` owns a model it creates)."""
        key = tree_key(tree_id, "model", model_id)
        t = Txn()
        if tenant is not None:
            t.check("owner", t.k(key), tenant)
        t.op(
            "model",
            t.k(key),
            dtype.value,
            len(data) // dtype.numpy.itemsize,
            t.blob(data),
            tenant if tenant is not None else owner,
        )
        try:
            return int((await self._script.commit(t))["version"])
        except Conflict:
            return None

    async def model_owner(self, tree_id: str, model_id: str) -> str | None:
        """The tenant that owns a model ("" for an operator's), None for no such model."""
        raw = await self.b.hmget(tree_key(tree_id, "model", model_id), "dtype", "tenant")
        if raw[0] is None:
            return None
        return (raw[1] or b"").decode()

    async def parameters(
        self, tree_id: str, model_id: str, include_data: bool = True
    ) -> tuple[DType, int, int, bytes] | None:
        fields = ["dtype", "length", "version"] + (["data"] if include_data else [])
        raw = await self.b.hmget(tree_key(tree_id, "model", model_id), fields)
        if raw[0] is None:
            return None
        return (
            DType(raw[0].decode()),
            int(raw[1]),
            int(raw[2]),
            raw[3] if include_data else b"",
        )

    async def load_parameters(self, spec: CommandSpec) -> np.ndarray:
        """The model's parameters for a parameter-server command (zeros when new)."""
        import numpy as np

        found = await self.parameters(spec.tree_id, spec.ps_model)
        if found is None:
            return np.zeros(spec.length, dtype=spec.dtype.numpy)
        return np.frombuffer(found[3], dtype=found[0].numpy).copy()

    async def save_parameters(self, spec: CommandSpec, params: np.ndarray) -> int:
        version = await self.set_parameters(
            spec.tree_id, spec.ps_model, spec.dtype, params.tobytes(), owner=spec.tenant
        )
        assert version is not None  # unchecked writes always land
        return version
