"""`lightpath switches ...` against a real switch agent process: what a switch is and
holds, its ports and counters, and the operator's fault drills, for people and --json."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from lightpath.cli import main
from lightpath.v1 import optical_switch_pb2 as sb
from tests.switch_agent.conftest import agent_process, as_manager, fabric

X = "ocs-x-0-0"


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_switches_cli_reads_a_switch_and_drills_faults(redis_url, tmp_path, capsys):
    with agent_process(redis_url, tmp_path, **fabric(k=2), LIGHTPATH_AGENT_SETTLE_MS="7") as ag:
        addr = ["--addr", ag.address]
        async with as_manager(ag.address) as s:
            await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id=X,
                    batch_id="b1",
                    connect=[sb.PortPair(port_a=8, port_b=1), sb.PortPair(port_a=9, port_b=2)],
                )
            )
            await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id="otm-5",
                    batch_id="o1",
                    set_outputs=[sb.OutputSelection(input=3, output=1)],
                )
            )

        code, out, _ = await run(capsys, "switches", "describe", X, *addr)
        assert code == 0 and f"{X}: OCS, 24 ports, version 1" in out
        assert out.splitlines()[1].strip() == (
            "settles in 7 ms; Lightpath reference agent (simulated MEMS)"
        )
        code, out, _ = await run(capsys, "switches", "describe", "otm-5", *addr, "--json")
        bank = json.loads(out)
        assert bank["kind"] == "SWITCH_KIND_ONE_TO_K" and bank["outputs"] == 2

        code, out, _ = await run(capsys, "switches", "cross-connects", X, *addr, "--json")
        state = json.loads(out)
        assert state["version"] == 1 and state["boot_id"]
        assert state["cross_connects"] == [
            {"port_a": 1, "port_b": 8},
            {"port_a": 2, "port_b": 9},
        ]
        code, out, _ = await run(capsys, "switches", "cross-connects", X, *addr, "-o", "name")
        assert out.split() == ["1-8", "2-9"]
        code, out, _ = await run(capsys, "switches", "cross-connects", "otm-5", *addr)
        assert code == 0 and out.splitlines()[0].split() == ["input", "output"]
        assert out.splitlines()[2].split() == ["3", "1"]

        code, out, _ = await run(capsys, "switches", "ports", X, *addr)
        lines = out.splitlines()[2:]
        assert [ln.split() for ln in lines] == [
            ["1", "connected", "8"],
            ["2", "connected", "9"],
            ["8", "connected", "1"],
            ["9", "connected", "2"],
        ]
        code, out, _ = await run(capsys, "switches", "ports", X, *addr, "--all", "--json")
        assert len(json.loads(out)["ports"]) == 24

        code, out, _ = await run(capsys, "switches", "stats", *addr, "--json")
        assert json.loads(out)["batches_applied"] == 2
        code, out, _ = await run(capsys, "switches", "stats", X, *addr)
        assert code == 0 and "batches applied" in out and X in out

        # a drill: the next batch refused, then cleared
        code, out, _ = await run(capsys, "switches", "fault", X, *addr, "--reject", "1")
        assert code == 0 and "the next batch refused" in out and "--clear" in out
        async with as_manager(ag.address) as s:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await s.ApplyBatch(
                    sb.ApplyBatchRequest(
                        switch_id=X, batch_id="b2", connect=[sb.PortPair(port_a=10, port_b=3)]
                    )
                )
            assert refused.value.code() == grpc.StatusCode.ABORTED
        code, out, _ = await run(capsys, "switches", "fault", "*", *addr, "--delay", "2s", "--json")
        r = json.loads(out)
        assert len(r["switch_ids"]) > 1 and r["faults"]["extra_delay"] == "2s"
        code, out, _ = await run(capsys, "switches", "fault", "*", *addr, "--clear")
        assert code == 0 and "no faults" in out

        # a restart forgets the tables: a new boot id, version 0, nothing connected
        code, out, _ = await run(capsys, "switches", "restart", X, *addr)
        assert code == 0 and "restarted with empty tables" in out and "ocs check" in out
        code, out, _ = await run(capsys, "switches", "cross-connects", X, *addr, "--json")
        after = json.loads(out)
        assert after["boot_id"] != state["boot_id"] and after["cross_connects"] == []

        # the client's mistakes, in words
        code, _, err = await run(capsys, "switches", "describe", "otm-99", *addr)
        assert code != 0 and "NOT_FOUND" in err
        code, _, err = await run(capsys, "switches", "fault", X, *addr, "--reject", "-1")
        assert code != 0 and "--reject must not be negative" in err
        with pytest.raises(SystemExit) as exit_:
            await run(capsys, "switches", "fault", X, *addr, "--delay", "soon")
        assert exit_.value.code == 2 and "not a duration" in capsys.readouterr().err


async def test_without_an_agent_the_cli_says_how_to_run_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LIGHTPATH_SWITCH_AGENT_ADDR", raising=False)
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(tmp_path))
    code, _, err = await run(capsys, "switches", "stats", "--pod", "pod-9")
    assert code != 0 and "lightpath up --switch-agents" in err
