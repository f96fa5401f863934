"""The one transaction primitive of every Redis store: declared keys, named checks, typed
answers.

A store builds a `Txn` of checks (what its decision assumed) and ops (writes, and reads
answered after them); `Script.commit(txn)` runs it as one Lua script: every check first —
when one fails nothing is written and `Conflict(reason)` is raised (take a new snapshot,
decide again) — then every op, answering a `Committed`.

- Every key a script touches is declared in KEYS (Redis Cluster, proxies and ACL key
  patterns refuse scripts that reach others; txn.lua's `call` refuses them too): by KEYS
  index, by name (`Txn.name`, the Lua's `key(name)`) or as a member of a family
  (`Txn.member`, the Lua's `member(family, id)`). A script that walks a set checks that
  its members were declared (`expect_declared`); when not, `commit` declares them, runs
  again, and declares them up front the next time.
- The script is txn.lua (generic checks and ops, the runner) followed by the store's own
  extension file (its CHECKS, OPS and AFTER hooks), with the store's constants as the Lua
  table `C`, made from the Python values (tests/common/test_txn.py checks that every `C.x`
  is defined). redis-py's Script runs it by EVALSHA and loads it again on NOSCRIPT.

An extension defines its checks and ops as `if USES.x then OPS.x = function(o) ... end
end` (txn.lua defines only what the Txn uses: each call runs the whole script again); a
generic op is nil when the Txn does not use it, so wrap one only under its USES.

API for stores built on this (say here when it changes): `Txn(families=...)`, `k`, `name`,
`member(s)`, `include`, the `expect_*` checks, `fence` (a lease token: refuse an older
one), `check(name, ...)`, the write ops (with
`expire`), `read`, `job_event` (its Lua twin `job_event(jk, hk, sk, maxlen, e, extra,
brief)`), `op(name, ...)`, `blob` (binary data as ARGV[i]); the Lua's `now_ms()` (Redis' clock);
`Program(package, file or [files] (none: txn.lua alone), constants).bind(redis)` → `Script`;
`await script.commit(txn)` → `Committed` (`reads`, `committed[name]`) or `Conflict`
(`reason`, `value`, str = message); `await script.applies(txn)` → whether it committed.

Durability (issue 32): Redis replicates asynchronously, so a commit the primary answered
can be lost when a replica is promoted. `require_replicas(client, Durability(n, ms))`
(done by redis_store.connect_with from LIGHTPATH_REDIS_COMMIT_REPLICAS) makes every
commit on `client` wait — `WAIT n ms`, on the script's own connection, in the same
round trip — until n replicas hold it and everything the primary held when it ran
(what a check or a read of it saw); a commit that reached fewer raises Unavailable
(REDIS_NOT_REPLICATED), a failed check too (rather than Conflict): what it wrote was
applied on the primary but is not acknowledged, and a retry (mutations are idempotent
by client-chosen ids) finds it — once replicated — or makes it again.
docs/operations.md says what this guarantees at which settings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from lightpath import redis_url
from lightpath_services.common.errors import Unavailable

# Conflicts a Txn raised for a set's members it had not declared are retried this often.
DECLARE_RETRIES = 4
UNDECLARED = "undeclared"
# The reason of a Conflict raised by `Txn.fence`: a newer holder of the lease wrote.
STALE_LEASE = "STALE_LEASE"


class Conflict(Exception):
    """A check of a transaction failed (state changed since the snapshot): nothing was
    written. `reason` names the check; `value` is what it found ("" when absent)."""

    def __init__(self, reason: str, message: str = "", value: str = ""):
        super().__init__(message or reason)
        self.reason = reason
        self.value = value


@dataclass(frozen=True)
class Committed:
    """A transaction applied: the `read` ops' answers in order, and what the extension's
    ops set by name."""

    reads: list[Any]
    values: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


@dataclass
class Txn:
    """Checks and ops of one atomic commit; keys are registered (KEYS, 1-based) as they are
    used. `families` makes a family member's key from its id (for `member` and for the
    members `commit` declares after an "undeclared" conflict)."""

    families: Mapping[str, Callable[[str], str]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    checks: list[list[Any]] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)
    # values that cannot travel in JSON (binary data): ARGV[2 ..], by `blob`'s index
    blobs: list[bytes] = field(default_factory=list)
    _index: dict[str, int] = field(default_factory=dict)
    _names: dict[str, int] = field(default_factory=dict)
    _members: dict[str, dict[str, int]] = field(default_factory=dict)
    # set key -> families, for the members commit declares on an "undeclared" conflict
    _walked: dict[int, Sequence[str]] = field(default_factory=dict)

    def k(self, key: str) -> int:
        i = self._index.get(key)
        if i is None:
            self.keys.append(key)
            i = self._index[key] = len(self.keys)
        return i

    def name(self, name: str, key: str) -> int:
        """Declare `key` as the Lua's `key(name)`."""
        i = self._names[name] = self.k(key)
        return i

    def member(self, family: str, member_id: str) -> int:
        """Declare the key of `member_id` in `family` (the Lua's `member(family, id)`)."""
        i = self._members.setdefault(family, {}).get(member_id)
        if i is None:
            i = self._members[family][member_id] = self.k(self.families[family](member_id))
        return i

    def members(self, family: str, ids: Iterable[str]) -> None:
        for member_id in ids:
            self.member(family, member_id)

    def include(self, other: Txn) -> None:
        """Declare the keys and names `other` declared (a store's fixed keys, made once)."""
        if not self.keys:  # the usual case, and a copy is far cheaper than declaring each
            self.keys, self._index, self._names = (
                list(other.keys),
                dict(other._index),
                dict(other._names),
            )
            return
        for name, i in other._names.items():
            self.name(name, other.keys[i - 1])
        for key in other.keys:
            self.k(key)

    # -- checks ---------------------------------------------------------------------

    def expect(
        self,
        key: str,
        f: str,
        allowed: Iterable[str],
        *,
        reason: str,
        message: str = "",
        absent: str = "",
    ) -> None:
        """Field `f` of hash `key` is one of `allowed` ("" = absent). Else Conflict(reason)
        with `message` ("{}" = the value found; `absent` when there is none)."""
        self.checks.append(["is", self.k(key), f, list(allowed), reason, message, absent])

    def expect_field(
        self, key: str, f: str, present: bool, *, reason: str, message: str = ""
    ) -> None:
        self.checks.append(["has", self.k(key), f, int(present), reason, message])

    def expect_no_key(self, key: str, *, reason: str, message: str = "") -> None:
        """`key` does not exist (an empty set, zset, hash or list counts as absent)."""
        self.checks.append(["nokey", self.k(key), reason, message])

    def expect_number(
        self, key: str, f: str, op: str, bound: float, *, reason: str, message: str = ""
    ) -> None:
        """Field `f` of hash `key` (absent: 0) `op` `bound`, op one of <= >= < >."""
        if op not in ("<=", ">=", "<", ">"):
            raise ValueError(f"no comparison {op!r}")
        self.checks.append(["num", self.k(key), f, op, bound, reason, message])

    def expect_declared(
        self, set_key: str, families: Sequence[str], *, if_in: tuple[str, str] | None = None
    ) -> None:
        """Every member of set `set_key` has its key declared in each of `families` (only
        checked when `if_in` = (set, member) holds, if given)."""
        guard, who = (self.k(if_in[0]), if_in[1]) if if_in else (0, "")
        i = self.k(set_key)
        self._walked[i] = families
        self.checks.append(["declared", i, list(families), guard, who])

    def fence(self, key: str, lease_id: str, token: int) -> None:
        """Fencing (issue 32): a write under lease `lease_id` holding `token`, a number
        its store hands out higher to every new holder. Conflict(STALE_LEASE, value: the
        newer token) when hash `key` holds a higher token for the lease, else the token
        is recorded there (the highest wins). 0 means unfenced: nothing is checked."""
        if token:
            i = self.k(key)
            self.checks.append(["fence", i, lease_id, token])
            self.ops.append(["fence", i, lease_id, token])

    def check(self, name: str, *args: Any) -> None:
        """A check of the store's extension (its CHECKS[name]); keys as `k` indices."""
        self.checks.append([name, *args])

    # -- ops ------------------------------------------------------------------------

    def hset(self, key: str, mapping: Mapping[Any, Any]) -> None:
        if mapping:
            flat: list[str] = []
            for f, v in mapping.items():
                flat += [str(f), str(v)]
            self.ops.append(["hset", self.k(key), *flat])

    def hdel(self, key: str, fields: Sequence[Any]) -> None:
        if fields:
            self.ops.append(["hdel", self.k(key), *map(str, fields)])

    def hincr(self, key: str, f: str, delta: int) -> None:
        self.ops.append(["hincr", self.k(key), f, delta])

    def zadd(self, key: str, score: float, member: str) -> None:
        self.ops.append(["zadd", self.k(key), score, member])

    def zrem(self, key: str, member: str) -> None:
        self.ops.append(["zrem", self.k(key), member])

    def sadd(self, key: str, member: str) -> None:
        self.ops.append(["sadd", self.k(key), member])

    def srem(self, key: str, member: str) -> None:
        self.ops.append(["srem", self.k(key), member])

    def delete(self, key: str) -> None:
        self.ops.append(["del", self.k(key)])

    def set_px(self, key: str, value: str, ttl_ms: int) -> None:
        self.ops.append(["setpx", self.k(key), value, ttl_ms])

    def expire(self, key: str, ttl_s: int) -> None:
        self.ops.append(["expire", self.k(key), ttl_s])

    def xadd(self, stream: str, maxlen: int, fields: Mapping[str, str]) -> None:
        flat = [x for kv in fields.items() for x in kv]
        self.ops.append(["xadd", self.k(stream), maxlen, *flat])

    def job_event(
        self,
        job_key: str,
        history_key: str,
        stream: str,
        maxlen: int,
        event: Mapping[str, Any],
        extra: Sequence[str] = (),
    ) -> None:
        """A job's transition: numbered ("n", from the job hash's "nev"), appended to its
        history list and to `stream` (fields `extra`, then "e": the JSON)."""
        self.ops.append(
            [
                "event",
                self.k(job_key),
                self.k(history_key),
                self.k(stream),
                maxlen,
                json.dumps(event, separators=(",", ":")),
                list(extra),
            ]
        )

    def read(self, command: str, key: str, *args: Any) -> None:
        """After the writes before it, `command` (HMGET, HGETALL, LRANGE, ...) on `key`:
        its answer is the next of Committed.reads."""
        self.ops.append(["read", command, self.k(key), *args])

    def op(self, name: str, *args: Any) -> None:
        """An op of the store's extension (its OPS[name]); keys as `k` indices."""
        self.ops.append([name, *args])

    def blob(self, data: bytes) -> int:
        """Pass `data` beside the JSON; an op reads it as ARGV[the index returned]."""
        self.blobs.append(data)
        return len(self.blobs) + 1

    def payload(self) -> tuple[list[str], str]:
        body = {"c": self.checks, "o": self.ops, "n": self._names, "f": self._members}
        return list(self.keys), json.dumps(body, separators=(",", ":"))


_CONSTANT = re.compile(r"\bC\.([A-Za-z_]\w*)")


class Program:
    """txn.lua, then a store's extension file from its package (or several, in order: helpers
    it shares with other scripts first), with `constants` as the Lua table C (str, numbers,
    bools, lists and str-keyed dicts of them)."""

    def __init__(self, package: str, extension: str | Sequence[str], constants: Mapping[str, Any]):
        files = [extension] if isinstance(extension, str) else list(extension)
        self.package = package
        self.extension = " + ".join(files)
        self.constants = dict(constants)
        core = resources.files(__package__).joinpath("txn.lua").read_text()
        self.lua = core + "".join(resources.files(package).joinpath(f).read_text() for f in files)
        # A table literal, not JSON decoded on every call (that costs a few µs each).
        self.source = f"local C = {_lua(self.constants)}\n{self.lua}\nreturn run()\n"
        PROGRAMS.append(self)

    def undefined(self) -> set[str]:
        """Constants the Lua uses (C.x) that Python does not define."""
        return set(_CONSTANT.findall(self.lua)) - set(self.constants)

    def unused(self) -> set[str]:
        """Constants Python defines that the Lua never uses."""
        return set(self.constants) - set(_CONSTANT.findall(self.lua))

    def bind(self, redis: Any) -> Script:
        return Script(redis.register_script(self.source), durability_of(redis))


PROGRAMS: list[Program] = []


_LUA_ESCAPES = {
    **{chr(i): f"\\{i:03d}" for i in (*range(32), 127)},
    '"': '\\"',
    "\\": "\\\\",
}


def _lua(value: Any) -> str:
    """`value` (str, int, float, bool, list, dict with str keys) as a Lua literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_LUA_ESCAPES.get(c, c) for c in value) + '"'
    if isinstance(value, list | tuple):
        return "{" + ", ".join(map(_lua, value)) + "}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"[{_lua(str(k))}] = {_lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


@dataclass(frozen=True)
class Durability:
    """How many replicas must hold a commit before it is acknowledged (0: none, the
    primary's answer is enough), and how long a commit waits for them."""

    replicas: int = 0
    timeout_ms: int = 1000


_DURABILITY = "_lightpath_durability"
# Nobody subscribes: a PUBLISH here only moves the connection's replication offset.
FENCE_CHANNEL = "lp:replication-fence"


def require_replicas(client: Any, durability: Durability) -> Any:
    """Make every Script bound to `client` from now on commit with `durability`;
    returns `client`. (The client carries it because it is what stores are given.)"""
    setattr(client, _DURABILITY, durability)
    return client


def durability_of(client: Any) -> Durability:
    return getattr(client, _DURABILITY, None) or Durability()


class Script:
    """A Program on one Redis client."""

    def __init__(self, script: Any, durability: Durability | None = None):
        self._script = script
        self.durability = durability or Durability()
        # set key -> its members at the last "undeclared" conflict: declared up front next time
        self._known: dict[str, list[str]] = {}

    async def applies(self, txn: Txn) -> bool:
        """Whether `txn` committed (False: a check failed, nothing was written)."""
        try:
            await self.commit(txn)
        except Conflict:
            return False
        return True

    async def commit(self, txn: Txn) -> Committed:
        """Apply `txn` atomically, or raise Conflict naming the first failed check."""
        for i, families in txn._walked.items():
            for member_id in self._known.get(txn.keys[i - 1], ()):
                for family in families:
                    txn.member(family, member_id)
        for _ in range(DECLARE_RETRIES):
            keys, arg = txn.payload()
            reply = await self._run(keys, [arg, *txn.blobs])
            if int(reply[0]) == 1:
                reads, named = reply[1], reply[2]
                names = map(_text, named[::2])
                return Committed(list(reads), dict(zip(names, named[1::2], strict=True)))
            reason, message, value = map(_text, reply[1:])
            if reason != UNDECLARED:
                raise Conflict(reason, message, value)
            ids, walked = json.loads(value), int(message)
            for family in txn._walked[walked]:
                txn.members(family, ids)
            self._known[txn.keys[walked - 1]] = ids
        raise Conflict(UNDECLARED, "a walked set kept changing", "")

    async def _run(self, keys: list[str], args: list[Any]) -> Any:
        if not self.durability.replicas:
            return await self._script(keys=keys, args=args)
        # One pipeline: one connection and one round trip. WAIT counts the replicas that
        # hold this connection's last write; the PUBLISH (propagated, so it is one) puts
        # that write after everything the primary holds — replication is one ordered
        # stream — so a script that wrote nothing (a conflict, a retry answered from a
        # record another connection wrote) waits for what it read, too.
        want, timeout_ms = self.durability.replicas, self.durability.timeout_ms
        script = self._script
        client = script.registered_client
        for _ in range(2):
            async with client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.publish(FENCE_CHANNEL, "")
                pipe.execute_command("WAIT", want, timeout_ms)
                reply, _, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):  # a restarted or promoted Redis
                await client.script_load(script.script)
                continue
            for answer in (reply, acked):
                if isinstance(answer, Exception):
                    raise answer
            if int(acked) < want:
                # A master whose replicas left may have been deposed: if so, the next
                # call goes to the new one rather than to this one until it is demoted.
                await redis_url.recheck_master(client)
                raise Unavailable(
                    f"the commit reached {acked} of the {want} Redis replicas "
                    f"LIGHTPATH_REDIS_COMMIT_REPLICAS asks for within {timeout_ms} ms, so "
                    "what it wrote or read might not survive a failover and is not "
                    "acknowledged; retry the call",
                    reason="REDIS_NOT_REPLICATED",
                    retry_delay_s=1.0,
                )
            return reply
        raise NoScriptError("the script was loaded but Redis still does not know it")


def _text(value: Any) -> Any:
    """A reply's name or message as str, on a client with decode_responses=False too."""
    return value.decode() if isinstance(value, bytes) else value
