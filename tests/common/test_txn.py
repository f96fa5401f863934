"""The transaction primitive (lightpath_services.common.txn) on a real Redis: checks before writes,
nothing written when one fails, typed answers, every key declared, constants from Python."""

from __future__ import annotations

import importlib
import json

import pytest
from redis.exceptions import ResponseError

from lightpath_services.common.txn import PROGRAMS, Conflict, Program, Txn

TEXT = 'a "quoted" \\ back\nslash\x00\x7f 5é ]==] \\0101'
PROGRAM = Program("tests.common", "txn_test.lua", {"STRIDE": 1 << 40, "TEXT": TEXT})
JOBS = "lp:{t}:jobs"
# Every store built on the primitive.
STORES = (
    "lightpath_services.cell_scheduler.store",
    "lightpath_services.workload_scheduler.store",
    "lightpath_services.ocs_manager.store",
    "lightpath_services.ocs_manager.switched.store",
    "lightpath_services.agg_switch.store",
    "lightpath_services.core_broker.store",
    "lightpath_services.core_broker.graphs",
    "lightpath_services.core_broker.graph_runs",
)


def job_key(job_id: str) -> str:
    return f"lp:{{t}}:job:{job_id}"


def txn() -> Txn:
    return Txn(families={"job": job_key})


async def test_checks_hold_then_ops_apply_and_reads_answer_after_them(redis_client):
    script = PROGRAM.bind(redis_client)
    await redis_client.hset(job_key("a"), mapping={"state": "QUEUED", "n": 2})
    t = txn()
    t.expect(job_key("a"), "state", ["QUEUED"], reason="phase", message="job a is {}")
    t.expect_number(job_key("a"), "n", ">=", 2, reason="stale")
    t.check("even", t.k(job_key("a")), "n")
    t.hset(job_key("a"), {"state": "PLACED"})
    t.hincr(job_key("a"), "n", 3)
    t.read("HMGET", job_key("a"), "state", "n")
    t.job_event(
        job_key("a"), job_key("a") + ":events", "lp:{t}:events", 100, {"to": "PLACED"}, ["job", "a"]
    )
    t.read("LRANGE", job_key("a") + ":events", 0, -1)
    done = await script.commit(t)
    assert done.reads[0] == ["PLACED", "5"]
    assert done.reads[1] == ['{"to":"PLACED","n":1}']
    (entry,) = await redis_client.xrange("lp:{t}:events")
    assert entry[1] == {"job": "a", "e": '{"to":"PLACED","n":1}'}


@pytest.mark.parametrize(
    ("check", "reason", "message", "value"),
    [
        (
            lambda t: t.expect(
                job_key("a"), "state", ["PLACED"], reason="phase", message="job a is {}"
            ),
            "phase",
            "job a is QUEUED",
            "QUEUED",
        ),
        (
            lambda t: t.expect(
                job_key("b"),
                "state",
                ["QUEUED"],
                reason="gone",
                message="is {}",
                absent="job b does not exist",
            ),
            "gone",
            "job b does not exist",
            "",
        ),
        (
            lambda t: t.expect_field(job_key("a"), "hold", True, reason="free", message="no hold"),
            "free",
            "no hold",
            "",
        ),
        (
            lambda t: t.expect_no_key(job_key("a"), reason="exists", message="job a exists"),
            "exists",
            "job a exists",
            "",
        ),
        (
            lambda t: t.expect_number(job_key("a"), "n", "<", 3, reason="newer", message="n is {}"),
            "newer",
            "n is 3",
            "3",
        ),
        (lambda t: t.check("even", t.k(job_key("a")), "n"), "odd", "n is odd", "3"),
    ],
)
async def test_a_failed_check_writes_nothing_and_says_which(
    redis_client, check, reason, message, value
):
    script = PROGRAM.bind(redis_client)
    await redis_client.delete(job_key("a"), job_key("b"))
    await redis_client.hset(job_key("a"), mapping={"state": "QUEUED", "n": 3})
    t = txn()
    t.hset(job_key("a"), {"state": "X"})  # an op before the failing check: still not applied
    t.expect(job_key("a"), "n", ["3"], reason="first")
    check(t)
    with pytest.raises(Conflict) as err:
        await script.commit(t)
    assert (err.value.reason, str(err.value), err.value.value) == (reason, message, value)
    assert await redis_client.hget(job_key("a"), "state") == "QUEUED"


async def test_a_walked_set_is_declared_by_retrying_and_remembered(redis_client):
    script = PROGRAM.bind(redis_client)
    await redis_client.delete(JOBS)
    for j, n in (("a", 1), ("b", 2)):
        await redis_client.sadd(JOBS, j)
        await redis_client.hset(job_key(j), "n", n)
    calls = 0
    real = script._script

    async def counting(**kw):
        nonlocal calls
        calls += 1
        return await real(**kw)

    script._script = counting

    def tally() -> Txn:
        t = txn()
        t.name("jobs", JOBS)
        t.expect_declared(JOBS, ["job"])
        t.op("tally")
        return t

    assert (await script.commit(tally()))["total"] == 3 << 40
    assert calls == 2  # the first answered "undeclared" with the members
    assert (await script.commit(tally()))["total"] == 3 << 40
    assert calls == 3  # remembered: declared up front
    # A guard that does not hold: the set is not walked, so it need not be declared.
    t = txn()
    t.expect_declared(JOBS, ["job"], if_in=("lp:{t}:down", "x"))
    await script.commit(t)


async def test_a_key_not_declared_is_refused_before_redis_touches_it(redis_client):
    t = txn()
    t.op("sneak", "lp:{t}:built-in-lua")
    with pytest.raises(ResponseError, match="undeclared key lp:\\{t\\}:built-in-lua"):
        await PROGRAM.bind(redis_client).commit(t)
    assert not await redis_client.exists("lp:{t}:built-in-lua")
    # BITOP names its keys after the operation: those are checked too.
    await redis_client.set("lp:{t}:built-in-lua", "x")
    t = txn()
    t.op("sneak_bitop", t.k("lp:{t}:dest"), "lp:{t}:built-in-lua")
    with pytest.raises(ResponseError, match="BITOP on undeclared key lp:\\{t\\}:built-in-lua"):
        await PROGRAM.bind(redis_client).commit(t)
    assert not await redis_client.exists("lp:{t}:dest")


async def test_the_script_is_loaded_again_after_redis_forgot_it(redis_client):
    script = PROGRAM.bind(redis_client)
    await redis_client.hset(job_key("a"), "n", 4)
    t = txn()
    t.read("HGET", job_key("a"), "n")
    assert (await script.commit(t)).reads == ["4"]
    await redis_client.script_flush()
    assert (await script.commit(t)).reads == ["4"]


async def test_constants_reach_the_lua_as_python_has_them(redis_client):
    t = txn()
    t.op("text")
    assert (await PROGRAM.bind(redis_client).commit(t)).reads == [TEXT]


def test_a_constant_the_lua_uses_but_python_lacks_is_found():
    drifted = Program("tests.common", "txn_test.lua", {"STRIDES": 1 << 40, "TEXT": ""})
    PROGRAMS.remove(drifted)
    assert drifted.undefined() == {"STRIDE"} and drifted.unused() == {"STRIDES"}


def test_every_store_program_defines_the_constants_its_lua_uses():
    for store in STORES:  # their programs are made as they are imported
        importlib.import_module(store)

    for program in PROGRAMS:
        assert not program.undefined(), (program.extension, program.undefined())
        assert not program.unused(), (program.extension, program.unused())
        assert "redis.call" not in program.lua.split("local function key(name)", 1)[1], (
            program.extension
        )


def test_a_txn_includes_the_keys_another_declared_under_their_names():
    fixed = txn()
    fixed.name("jobs", JOBS)
    t = txn()
    t.include(fixed)
    assert t.keys == [JOBS] and json.loads(t.payload()[1])["n"] == {"jobs": 1}
    later = txn()
    later.k(job_key("a"))
    later.include(fixed)
    assert later.keys == [job_key("a"), JOBS] and json.loads(later.payload()[1])["n"] == {"jobs": 2}
    fixed.name("down", "lp:{t}:down")  # the copy is its own
    assert t.keys == [JOBS]


async def test_a_commit_waiting_for_a_replica_that_is_not_there_is_unavailable(redis_client):
    """LIGHTPATH_REDIS_COMMIT_REPLICAS on a server with no replica: the commit is applied
    (nothing can take it back) but not acknowledged: UNAVAILABLE naming the setting. A
    check that fails is UNAVAILABLE too: what it saw may not survive a failover."""
    from lightpath_services.common.errors import Unavailable
    from lightpath_services.common.txn import Durability, require_replicas

    script = PROGRAM.bind(require_replicas(redis_client, Durability(1, 50)))
    assert script.durability == Durability(1, 50)
    t = txn()
    t.hset(job_key("w"), {"state": "QUEUED"})
    with pytest.raises(Unavailable, match=r"reached 0 of the 1 .*COMMIT_REPLICAS") as err:
        await script.commit(t)
    assert err.value.reason == "REDIS_NOT_REPLICATED"
    assert await redis_client.hget(job_key("w"), "state") == "QUEUED"
    t = txn()
    t.expect(job_key("w"), "state", ["PLACED"], reason="phase")
    t.hset(job_key("w"), {"state": "ENDED"})
    with pytest.raises(Unavailable, match="what it wrote or read"):
        await script.commit(t)
    assert await redis_client.hget(job_key("w"), "state") == "QUEUED"
    # Loaded again by the pipeline after the server forgot it (a restart, a new master).
    await redis_client.script_flush()
    t = txn()
    t.hset(job_key("w"), {"n": 1})
    with pytest.raises(Unavailable):
        await script.commit(t)
    assert await redis_client.hget(job_key("w"), "n") == "1"
    # Without the setting the primary's answer is the acknowledgement.
    plain = PROGRAM.bind(require_replicas(redis_client, Durability()))
    t = txn()
    t.hset(job_key("w"), {"n": 2})
    await plain.commit(t)
