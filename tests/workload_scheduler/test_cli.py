"""WS-9: the CLI draws the block map of seed Fig. 2 for people."""

from __future__ import annotations

from lightpath.cli import build_parser
from lightpath.cli.pod import describe_event, render_pod
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as w


def _view() -> w.PodView:
    view = w.PodView(
        pod_id="pod-1",
        block_shape=c.Shape(dims=[4, 4, 4]),
        block_count=64,
        ocs_per_axis=1,
        jobs_by_state={"RUNNING": 2, "PENDING": 1},
    )
    owners = {0: "train-a", 1: "train-a", 9: "train-a", 10: "train-a", 20: "eval-b", 33: "eval-b"}
    for b in range(64):
        view.blocks.append(
            w.BlockView(
                block_id=b,
                node_type="gpu" if b >= 60 else "tpu",
                health=c.BLOCK_HEALTH_FAILED if b in (5, 42) else c.BLOCK_HEALTH_HEALTHY,
                job_id=owners.get(b, ""),
            )
        )
    view.live_jobs.extend(
        [
            w.JobSummary(
                job_id="train-a",
                state=c.JOB_STATE_RUNNING,
                priority=80,
                grid=c.Shape(dims=[2, 2, 1]),
            ),
            w.JobSummary(
                job_id="eval-b",
                state=c.JOB_STATE_RUNNING,
                priority=50,
                grid=c.Shape(dims=[2, 1, 1]),
            ),
            w.JobSummary(
                job_id="waiting",
                state=c.JOB_STATE_PENDING,
                priority=20,
                grid=c.Shape(dims=[8, 8, 1]),
            ),
        ]
    )
    view.types.append(w.TypeCounts(node_type="tpu", total=60, free=52, allocated=6, failed=2))
    view.types.append(w.TypeCounts(node_type="gpu", total=4, free=4))
    return view


def test_block_map_rows_show_free_failed_and_each_slice():
    out = render_pod(_view())
    lines = out.splitlines()
    assert lines[0] == "pod pod-1: 64 blocks of 4x4x4 chips, K=1"
    rows = {int(line.split()[0]): line.split()[1:] for line in lines[3:11]}
    assert rows[0] == ["A", "A", ".", ".", ".", "X", ".", "."]
    assert rows[8] == [".", "A", "A", ".", ".", ".", ".", "."]
    assert rows[16][4] == "B" and rows[32][1] == "B" and rows[40][2] == "X"
    assert rows[56][4:] == [".'"] * 4  # the gpu blocks are marked as another type
    assert "A  train-a  RUNNING  priority 80  2x2x1 blocks" in out
    assert "B  eval-b  RUNNING  priority 50  2x1x1 blocks" in out
    assert "queue:  waiting (PENDING, p20, 8x8x1)" in out
    assert "tpu 60 (52 free, 6 allocated, 2 failed)" in out


def test_events_read_as_one_line_each():
    ev = w.PodEvent(
        job=c.JobEvent(
            job_id="j", from_state=c.JOB_STATE_WIRING, to_state=c.JOB_STATE_RUNNING, reason="wired"
        )
    )
    assert "j: WIRING -> RUNNING  wired" in describe_event(ev)
    blk = w.PodEvent(block=w.BlockEvent(block_id=7, health=c.BLOCK_HEALTH_FAILED, reason="fan"))
    assert "block 7 FAILED  fan" in describe_event(blk)


def test_pod_and_rings_commands_parse():
    args = build_parser().parse_args(["pod", "pod-2", "--json"])
    assert args.pod_id == "pod-2" and args.json
    args = build_parser().parse_args(["rings", "8x8x4", "--data", "8", "--layer", "4"])
    assert (args.data, args.pipeline, args.layer) == (8, 0, 4)  # 0: not given


def test_degrees_not_given_make_up_the_chip_count():
    from lightpath.sdk.cell import fill_degrees

    assert fill_degrees(256) == (256, 1, 1)
    assert fill_degrees(256, data=8, layer=4) == (8, 8, 4)
    assert fill_degrees(256, pipeline=4) == (64, 4, 1)
    assert fill_degrees(256, 8, 4, 8) == (8, 4, 8)
    assert fill_degrees(256, data=3) == (3, 1, 1)  # no fit: the pod says why


async def test_pod_command_against_the_real_scheduler(pod16, capsys):
    import asyncio
    import json

    from lightpath.cli import main

    await pod16.admit("shown", (8, 8, 4))
    await pod16.fail(15, "bad optics")
    addr = pod16.addresses[0]
    code = await asyncio.to_thread(main, ["pod", "pod-w", "--addr", addr, "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pod_id"] == "pod-w" and len(data["blocks"]) == 16
    assert sum(1 for b in data["blocks"] if b.get("job_id") == "shown") == 4
    assert data["blocks"][15]["health"] == "BLOCK_HEALTH_FAILED"
    assert await asyncio.to_thread(main, ["pod", "pod-w", "--addr", addr]) == 0
    out = capsys.readouterr().out
    assert "A  shown  RUNNING" in out and " X" in out.splitlines()[4]
    assert await asyncio.to_thread(main, ["pod", "pod-9", "--addr", addr]) == 1
    assert "serves pod pod-w, not pod-9" in capsys.readouterr().err
    code = await asyncio.to_thread(
        main,
        [
            "rings",
            "8x8x4",
            "--data",
            "8",
            "--pipeline",
            "4",
            "--layer",
            "8",
            "--pod",
            "pod-w",
            "--addr",
            addr,
        ],
    )
    assert code == 0 and "pipeline degree 4" in capsys.readouterr().out
    # with no degrees given, the defaults make a plan (all data parallelism)
    code = await asyncio.to_thread(main, ["rings", "8x8x4", "--pod", "pod-w", "--addr", addr])
    assert code == 0 and "data     degree 256" in capsys.readouterr().out
