"""X-6: the job system's commands against a real cell (each also with --json)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from lightpath.cli import main
from lightpath.cli.cell import parse_deadline


async def run(capsys, *argv: str) -> tuple[int, str]:
    """Run the CLI in a thread (it runs its own event loop) and capture what it printed."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


async def test_daily_commands_through_the_cell(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    code, out = await run(
        capsys, "submit", "cli-1", "--shape", "8x8x4", "--class", "high", "--tenant", "acme"
    )
    assert code == 0, out
    assert "job cli-1 (acme): RUNNING on pod-a, priority 80, 8x8x4 chips (4 blocks)" in out
    assert "placed on pod pod-a" in out

    code, out = await run(capsys, "submit", "cli-2", "--shape", "1x1x2", "--blocks", "--json")
    assert code == 0 and json.loads(out)["job"]["pod_id"] == "pod-b"

    code, out = await run(
        capsys, "submit", "cli-3", "--chip-hours", "128", "--deadline", "1h", "--type", "tpu"
    )
    assert code == 0 and "4x4x8 chips (2 blocks) derived from its demand" in out, out

    code, out = await run(capsys, "jobs", "--json")
    assert [j["job_id"] for j in json.loads(out)["jobs"]] == ["cli-3", "cli-2", "cli-1"]
    code, out = await run(capsys, "jobs", "--tenant", "acme")
    assert "cli-1" in out and "cli-2" not in out and "RUNNING" in out

    code, out = await run(capsys, "job", "cli-1")
    assert "blocks: " in out and "WIRING -> RUNNING" in out

    code, out = await run(capsys, "pods")
    assert "pod-a" in out and "READY" in out and "OCS_TORUS" in out
    code, out = await run(capsys, "pods", "--json")
    assert {p["registration"]["pod_id"] for p in json.loads(out)["pods"]} == {"pod-a", "pod-b"}

    code, out = await run(capsys, "pod", "pod-a")
    assert code == 0 and out.startswith("pod pod-a: 8 blocks of 4x4x4 chips, K=1")
    assert "cli-1  RUNNING  priority 80" in out and "cell:   READY" in out
    code, out = await run(capsys, "pod", "pod-a", "--json")
    assert json.loads(out)["view"]["pod_id"] == "pod-a"

    code, out = await run(capsys, "block", "pod-a", "1", "--failed", "--reason", "cli test")
    assert code == 0 and "pod pod-a block 1:" in out

    code, out = await run(capsys, "complete", "cli-2", "--json")
    assert json.loads(out)["state"] == "JOB_STATE_COMPLETED"
    code, out = await run(capsys, "cancel", "cli-1", "--reason", "done testing")
    assert "CANCELLED" in out
    code, out = await run(capsys, "watch", "cli-1")  # ended: history, then the stream ends
    assert "[pod-a] - -> PENDING  forwarding to pod pod-a" in out
    assert "[pod-a] RUNNING -> CANCELLED  cancelled: done testing" in out

    # a pod preference; then priority and labels changed without resubmitting
    code, out = await run(capsys, "submit", "cli-4", "--shape", "4x4x4", "--pod", "pod-b")
    assert code == 0 and "RUNNING on pod-b" in out and "the pod asked for" in out, out
    code, out = await run(
        capsys, "update", "cli-4", "--priority", "77", "--label", "team=ml", "--label", "x=1"
    )
    assert code == 0 and "priority 77" in out and "labels: team=ml, x=1" in out, out
    code, out = await run(capsys, "update", "cli-4", "--label", "x-", "--json")
    job = json.loads(out)
    assert job["priority"] == 77 and job["spec"]["labels"] == {"team": "ml"}
    assert job["pod_job"]["history"][-1]["reason"] == "updated: labels removed x"
    code, out = await run(capsys, "update", "cli-4", "--priority", "0")
    assert code == 1 and "spec.priority" in out and "1..100" in out
    code, out = await run(capsys, "update", "cli-4")
    assert code != 0 and "nothing to change" in out
    code, out = await run(capsys, "update", "cli-4", "--label", "oops")
    assert code != 0 and "KEY=VALUE" in out
    code, out = await run(capsys, "submit", "cli-5", "--shape", "4x4x4", "--pod", "pod-9")
    assert code == 1 and "preferred_pod" in out and "pod-a, pod-b" in out

    code, out = await run(capsys, "job", "nope")
    assert code == 1 and "NOT_FOUND" in out
    code, out = await run(capsys, "submit", "bad", "--shape", "6x4x4")
    assert code == 1 and "spec.shape.dims[0]" in out


async def test_an_unknown_node_type_lists_the_known_ones(cell2, capsys, monkeypatch):
    """Issue 33: `--type fpga` advised "give the shape in blocks"."""
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    code, out = await run(capsys, "submit", "fp-1", "--shape", "8x8x4", "--type", "fpga")
    assert code == 1 and "--type (node_type): " in out, out
    assert "no pod of the cell has 'fpga' blocks; the cell's node types: tpu" in out, out
    assert "give the shape in blocks" not in out


def test_deadlines_read_as_durations_or_times():
    now = 1_700_000_000.25
    assert parse_deadline("2h", now).timestamp() == 1_700_000_002 + 7200
    assert parse_deadline("90m", now).timestamp() == 1_700_000_002 + 5400
    assert parse_deadline("2024-05-01T12:00:00", now) == datetime(2024, 5, 1, 12, tzinfo=UTC)
    with pytest.raises(SystemExit):
        parse_deadline("soon", now)


async def test_sub_block_twisted_and_host_commands_through_the_cell(cell2, capsys, monkeypatch):
    # Issue 28, as a user types it.
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    code, out = await run(capsys, "submit", "small-1", "--shape", "2x2x1")
    assert code == 0, out
    assert "small-1 (default): RUNNING on pod-a, priority 50, 2x2x1 chips (a box inside" in out
    assert "  box:    chips 2x2x1 at (0,0,0) of block " in out
    assert ", a mesh, no OCS change" in out

    code, out = await run(capsys, "job", "small-1", "--json")
    box = json.loads(out)["pod_job"]["box"]
    assert code == 0 and box["chips"]["dims"] == [2, 2, 1] and box["job_id"] == "small-1"
    block = box["block_id"]

    code, out = await run(
        capsys, "submit", "tw-1", "--shape", "4x4x8", "--twisted", "--pod", "pod-a"
    )
    assert code == 0 and "4x4x8 chips (2 blocks), a twisted torus" in out, out
    code, out = await run(capsys, "submit", "tw-2", "--shape", "4x8x12", "--twisted")
    assert code == 1 and "--twisted (spec.twisted): " in out, out

    code, out = await run(capsys, "block", "pod-a", str(block), "--failed", "--host", "15")
    assert code == 0 and out.startswith(f"pod pod-a block {block} host 15: "), out
    assert f"block {block}: hosts 15 failed, " in out
    code, out = await run(capsys, "pod", "pod-a")
    assert code == 0 and "sub-block blocks (hosts of 2x2x1 chips):" in out, out
    assert "chips 2x2x1 at (0,0,0) of block" in out and "hosts 15 failed" in out
    assert "  tw-1  RUNNING  priority 50  1x1x2 blocks, a twisted torus" in out
    code, out = await run(capsys, "block", "pod-a", str(block), "--healthy", "--host", "15")
    assert code == 0 and "host 15: " in out
    code, out = await run(capsys, "block", "pod-a", str(block), "--failed", "--host", "16")
    assert code == 1 and "--host (host): " in out, out

    code, out = await run(capsys, "pods")
    assert code == 0 and "chips free" in out and "/512 (box " in out
