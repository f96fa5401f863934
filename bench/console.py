"""How fast the web console's block map follows the API (issue 21): a real stack (the cell
and one superpod) with its console, a real headless Chromium showing the pod's block map,
and `--rounds` rounds of: submit a one-block job through the cell (the SDK), time until
its block shows in the open page; report one of its blocks failed, time until the map
shows it failed. Needs /usr/bin/chromium (dev.py test installs it) and Playwright.

    python3 dev.py bench console [--rounds 20]

Prints one JSON line: p50 / p90 / max seconds from the start of the submit call (which
returns once the job runs) and from the failure report's return, to the page's change."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import emit, percentile

from lightpath.embedded_redis import free_port
from lightpath.sdk import Cell
from lightpath.stack import Stack, default_topology, with_ephemeral_ports

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    names = {"cell-scheduler", "ocs-pod-1", "ws-pod-1"}
    specs = [s for s in with_ephemeral_ports(default_topology()) if s.name in names]
    submit_s, fail_s = [], []
    with tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp:
        stack = Stack(
            Path(tmp), specs=specs, redis_port=0, console_port=free_port(), log=lambda *_: None
        )
        stack.start()
        try:
            with (
                sync_playwright() as p,
                Cell(stack.endpoints["cell-scheduler"], credentials=stack.operator) as cell,
            ):
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
                page = browser.new_context(ignore_https_errors=True).new_page()
                page.goto(stack.console_url + "#/pod/pod-1")
                page.wait_for_selector("body[data-updates]", state="attached")
                for i in range(args.rounds):
                    job = f"bench-{i}"
                    started = time.monotonic()
                    cell.submit(job, (4, 4, 4))
                    page.wait_for_selector(f'g.block[data-job="{job}"]', timeout=60_000)
                    submit_s.append(time.monotonic() - started)
                    block = int(
                        page.locator(f'g.block[data-job="{job}"]').first.get_attribute("data-block")
                    )
                    cell.report_block_health("pod-1", block, failed=True, reason="bench")
                    started = time.monotonic()
                    page.wait_for_selector(
                        f'g.block[data-block="{block}"][data-health="FAILED"]', timeout=60_000
                    )
                    fail_s.append(time.monotonic() - started)
                    cell.report_block_health("pod-1", block, failed=False, reason="bench")
                    cell.cancel(job)
                browser.close()
        finally:
            stack.stop()
    emit(
        {
            "bench": "console",
            "rounds": args.rounds,
            "submit_to_block_map_s": {
                "p50": percentile(submit_s, 50),
                "p90": percentile(submit_s, 90),
                "max": max(submit_s),
            },
            "failure_to_block_map_s": {
                "p50": percentile(fail_s, 50),
                "p90": percentile(fail_s, 90),
                "max": max(fail_s),
            },
            "target_s": 2.0,
        }
    )


if __name__ == "__main__":
    main()
