"""Batches kept under their idempotency keys (services/common/idempotency.py): the
behaviour the switch agent and the ocs_manager's device drivers both rely on."""

import asyncio

import pytest

from lightpath_services.common.idempotency import KeptBatches


async def _value(v: str, gate: asyncio.Event | None = None) -> str:
    if gate is not None:
        await gate.wait()
    return v


async def _boom() -> str:
    raise RuntimeError("switch said no")


async def test_a_repeat_waits_for_the_same_outcome_and_the_batch_runs_once():
    keys: KeptBatches[str, str] = KeptBatches()
    gate = asyncio.Event()
    first = keys.start("k", "fp", _value("done", gate))
    kept = keys.get("k")
    assert kept is not None and kept[0] == "fp" and kept[1] is first
    gate.set()
    assert await first == "done"
    assert await keys.get("k")[1] == "done"  # type: ignore[index]


async def test_a_failure_is_kept_for_repeats_and_counted_once():
    failures = []
    keys: KeptBatches[str, str] = KeptBatches()
    future = keys.start("k", "fp", _boom(), lambda: failures.append(1))
    with pytest.raises(RuntimeError, match="switch said no"):
        await future
    with pytest.raises(RuntimeError):
        await keys.get("k")[1]  # type: ignore[index]
    assert failures == [1]


async def test_the_oldest_key_is_forgotten_beyond_the_bound():
    keys: KeptBatches[str, str] = KeptBatches(kept=2)
    for k in "abc":
        await keys.start(k, k, _value(k))
    assert keys.get("a") is None
    assert keys.get("b") is not None and keys.get("c") is not None


async def test_a_batch_runs_on_when_its_caller_goes_away():
    keys: KeptBatches[str, str] = KeptBatches()
    gate = asyncio.Event()
    future = keys.start("k", "fp", _value("done", gate))
    waiter = asyncio.ensure_future(asyncio.shield(future))
    waiter.cancel()
    gate.set()
    assert await future == "done"


async def test_only_an_unfinished_batch_is_forgotten():
    keys: KeptBatches[str, str] = KeptBatches()
    await keys.start("done", "fp", _value("x"))
    gate = asyncio.Event()
    running = keys.start("running", "fp", _value("y", gate))
    keys.forget_unfinished("done")
    keys.forget_unfinished("running")
    assert keys.get("done") is not None
    assert keys.get("running") is None  # the same key later is a new attempt
    gate.set()
    assert await running == "y"
    keys.clear()
    assert keys.get("done") is None
