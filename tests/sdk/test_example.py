"""examples/sdk_submit.py (docs/sdk.md's example) runs as a script against a real cell."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def test_the_documented_example_runs_against_a_real_cell(cell2):
    env = {
        **os.environ,  # LIGHTPATH_TLS_*: the operator's certificate from the test CA
        "LIGHTPATH_CELL_ADDR": cell2.cell_addresses[0],
        "PYTHONPATH": str(ROOT),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "sdk_submit.py"),
        "ex-1",
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "refused: spec.shape.dims[0]:" in text
    assert "ex-1 is RUNNING on pod-" in text and "(1 blocks)" in text
    assert "running: ex-1 on pod-" in text
    assert "ex-1 ended COMPLETED" in text
    assert "RUNNING -> COMPLETED" in text
    job = await cell2.job("ex-1")
    assert job.tenant == "example" and job.priority == 80
