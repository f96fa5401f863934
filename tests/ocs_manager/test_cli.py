"""`lightpath ocs ...` against a real ocs_manager (K = 2): people's output and --json."""

from __future__ import annotations

import asyncio
import json

from lightpath.cli import main
from lightpath.client import channel
from lightpath.demo import DemoContext
from lightpath.demo import ocs as demo
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc
from tests.helpers import serve
from tests.ocs_manager.conftest import fabric_env, wire_request


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_ocs_cli_reads_everything(redis_url, capsys):
    async with serve("ocs_manager", redis_url, fabric_env(k=2, blocks=8)) as svc:
        addr = ["--addr", svc.address]
        async with channel(svc.address) as ch:
            stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
            await stub.WireSlice(wire_request("ring", [2, 1, 1], [0, 1]))

        code, out, _ = await run(capsys, "ocs", "fabric", *addr)
        assert code == 0 and "K=2" in out and "96 OCS" in out
        code, out, _ = await run(capsys, "ocs", "fabric", *addr, "--json")
        assert json.loads(out)["config"]["ocs_per_axis"] == 2

        code, out, _ = await run(capsys, "ocs", "switches", *addr, "--json")
        switches = json.loads(out)["switches"]
        assert len(switches) == 96 and {s["ocs_id"] for s in switches} >= {"ocs-x-0-1"}
        code, out, _ = await run(capsys, "ocs", "switches", *addr)
        assert "ocs-z-15-1" in out
        code, out, _ = await run(capsys, "ocs", "switches", *addr, "-o", "name")
        assert len(out.split()) == 96 and "ocs-x-0-1" in out.split()
        code, out, _ = await run(capsys, "ocs", "switches", *addr, "--no-headers")
        assert len(out.strip().splitlines()) == 96 and out.startswith("ocs-")

        code, out, _ = await run(capsys, "ocs", "table", "ocs-x-0-1", *addr)
        assert code == 0 and "ring" in out and "block 0 second end" in out
        code, out, err = await run(capsys, "ocs", "table", "ocs-x-0-2", *addr)
        assert code == 1 and "NOT_FOUND" in err

        code, out, _ = await run(capsys, "ocs", "slices", *addr, "--json")
        assert [s["job_id"] for s in json.loads(out)["slices"]] == ["ring"]
        code, out, _ = await run(capsys, "ocs", "slices", *addr, "-o", "name")
        assert out.split() == ["ring"]
        code, out, _ = await run(capsys, "ocs", "slice", "ring", *addr, "--cross-connects")
        assert "96 cross-connects" in out and "otm-0-x-0" in out
        code, out, _ = await run(capsys, "ocs", "slice", "ring", *addr, "--json")
        assert len(json.loads(out)["cross_connects"]) == 96

        code, out, _ = await run(capsys, "ocs", "otm", "--job", "ring", *addr)
        assert "otm-1-x-0" in out and "ocs-x-0-0" in out
        code, out, _ = await run(capsys, "ocs", "otm", "--block", "5", "--all", *addr, "--json")
        assert len(json.loads(out)["states"]) == 48

        code, out, _ = await run(capsys, "ocs", "check", "--compare-switches", *addr)
        assert code == 0 and "every wiring invariant holds" in out and "OCS-6" not in out

        code, out, err = await run(
            capsys, "ocs", "plan", "--blocks", "64", "--k", "1", "--radix", "96", *addr
        )
        assert code == 1 and "128" in err and "ocs_radix" in err
        code, out, _ = await run(
            capsys, "ocs", "plan", "--blocks", "4", "--k", "2", "--radix", "8", *addr
        )
        assert code == 0 and "6 ports used" in out


async def test_demo_step_wires_replaces_and_releases(redis_url, capsys, spans_factory):
    async with serve("ocs_manager", redis_url, fabric_env(k=2, pod="pod-2")) as svc:
        ctx = DemoContext({"ocs-pod-2": svc.address}, spans_factory("demo").provider)
        try:
            await demo.run(ctx)
            await demo.run(ctx)  # again: it cleans up after itself
        finally:
            await ctx.close()
        out = capsys.readouterr().out
        assert "blocks 62 | 63" in out and "96 cross-connects, 96 1x2 settings" in out
        assert "otm-62-x-0              o2      ocs-x-0-1" in out
        assert "64 cross-connects moved, 32 untouched" in out
        assert "invariants: ok" in out and "96 cross-connects removed" in out
        async with channel(svc.address) as ch:
            stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
            assert not (await stub.ListSlices(pb.ListSlicesRequest())).slices
