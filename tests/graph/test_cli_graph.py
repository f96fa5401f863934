"""`lightpath graph plan | run | example` (X-6: every read has --json)."""

from __future__ import annotations

import asyncio
import json

from lightpath.cli import main
from lightpath.v1 import core_broker_pb2 as pb
from tests.core_broker.conftest import running_broker


def test_example_then_plan_prints_the_fig_2b_sets(tmp_path, capsys):
    assert main(["graph", "example", "fig-2a", str(tmp_path), "--records", "50"]) == 0
    spec = capsys.readouterr().out.strip()
    assert main(["graph", "plan", spec, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["members"] for s in plan["folded_sets"]] == [
        ["204A", "204B", "204E", "204F", "204G", "204C", "204D"],
        ["204H"],
        ["204I", "204J"],
    ]
    assert (plan["processes_before"], plan["processes_after"]) == (10, 3)
    assert main(["graph", "plan", spec, "--unfolded"]) == 0
    assert "processes: 10 one per component, 10 folded" in capsys.readouterr().out


def test_plan_of_an_invalid_graph_names_the_flow(tmp_path, capsys):
    (tmp_path / "g.json").write_text(
        json.dumps(
            {
                "graph_id": "bad",
                "components": [{"id": "a", "kind": "reformat"}, {"id": "b", "kind": "reformat"}],
                "flows": [
                    {"source": {"node": "a"}, "target": {"node": "b"}},
                    {"source": {"node": "b"}, "target": {"node": "a"}},
                ],
            }
        )
    )
    assert main(["graph", "plan", str(tmp_path / "g.json")]) == 1
    err = capsys.readouterr().err
    assert "flows[1]: closes a cycle a -> b -> a" in err


def test_run_reports_per_component_metrics_as_json(tmp_path, capsys):
    assert (
        main(["graph", "example", "fig-3a", str(tmp_path), "--records", "300", "--degree", "2"])
        == 0
    )
    spec = capsys.readouterr().out.strip()
    assert main(["graph", "run", spec, "--json", "--run-dir", str(tmp_path / "run")]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["folded"] is True
    assert metrics["records_read"] == 300  # --json prints 64-bit integers as numbers
    assert [c["component"] for c in metrics["components"]] == ["304A", "304B", "304C"]
    assert {p["folded_set"] for p in metrics["processes"]} == {"set-0"}
    assert len(metrics["processes"]) == 2
    assert (tmp_path / "out" / "306.0.tsv").exists() and (tmp_path / "out" / "306.1.tsv").exists()


async def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_plan_reserve_run_report_and_metrics_through_the_broker(
    redis_url, tmp_path, capsys, monkeypatch
):
    async with running_broker(redis_url) as b:
        await b.device("npu-1", 4, kind=pb.DEVICE_KIND_NPU)
        app = await b.app("etl")
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.setenv("LIGHTPATH_CB_TOKEN", app[0][1].removeprefix("Bearer "))
        code, out, _ = await cli(
            capsys, "graph", "example", "fig-2a", str(tmp_path), "--records", "400"
        )
        spec = out.strip()

        code, out, _ = await cli(capsys, "graph", "plan", spec, "--broker")
        assert code == 0 and "processes: 10 one per component, 3 folded" in out

        code, out, _ = await cli(
            capsys, "graph", "reserve", spec, "g-1", "--cores", "1", "--duration", "10m", "--json"
        )
        held = json.loads(out)
        assert code == 0 and held["complete"] is True
        assert [p["reservation"]["reservation_id"] for p in held["processes"]] == [
            "g-1.set-0.0",
            "g-1.set-1.0",
            "g-1.set-2.0",
        ]
        code, out, _ = await cli(
            capsys, "graph", "reserve", spec, "g-2", "--cores", "1", "--duration", "10m"
        )
        assert code == 1 and "NOT every process holds cores" in out and "REJECTED" in out

        code, out, err = await cli(
            capsys,
            "graph",
            "run",
            spec,
            "--report",
            "--run-id",
            "r-1",
            "--run-dir",
            str(tmp_path / "run"),
        )
        assert code == 0 and "reported run r-1 of fig-2a" in err
        code, out, _ = await cli(
            capsys, "graph", "metrics", "fig-2a", "--component", "204H", "--json"
        )
        metrics = json.loads(out)
        assert code == 0 and metrics["run_id"] == "r-1"
        assert [c["component"] for c in metrics["components"]] == ["204H"]
        code, out, _ = await cli(capsys, "graph", "metrics", "fig-2a")
        assert code == 0 and "204F.out -> 204H.in" in out and "set-2" in out
        code, _, err = await cli(capsys, "graph", "metrics", "nope")
        assert code == 1 and "NOT_FOUND" in err.upper()


async def test_run_on_the_broker_then_status_and_cancel(redis_url, tmp_path, capsys, monkeypatch):
    """`graph run --broker --reservation ID --wait`: the graph runs on the broker's host
    (the example's absolute paths lie in the broker's data directory)."""
    async with running_broker(redis_url, LIGHTPATH_CB_GRAPH_DATA_DIR=str(tmp_path)) as b:
        await b.device("npu-1", 4, kind=pb.DEVICE_KIND_NPU)
        app = await b.app("etl")
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.setenv("LIGHTPATH_CB_TOKEN", app[0][1].removeprefix("Bearer "))
        code, out, _ = await cli(
            capsys, "graph", "example", "fig-3a", str(tmp_path), "--records", "300", "--degree", "2"
        )
        spec = out.strip()
        code, _, err = await cli(capsys, "graph", "run", spec, "--broker")
        assert code == 1 and "--reservation" in err and "lightpath graph reserve" in err
        code, _, _ = await cli(
            capsys, "graph", "reserve", spec, "g-1", "--cores", "1", "--duration", "10m"
        )
        assert code == 0
        code, out, _ = await cli(
            capsys,
            "graph",
            "run",
            spec,
            "--broker",
            "--reservation",
            "g-1",
            "--run-id",
            "cli-run",
            "--wait",
        )
        assert code == 0, out
        assert "run cli-run of graph fig-3a for etl: succeeded" in out
        assert "300 records" in out and "304B" in out
        assert (tmp_path / "out" / "306.0.tsv").exists()
        code, out, _ = await cli(capsys, "graph", "status", "cli-run", "--json")
        assert code == 0 and json.loads(out)["state"] == "GRAPH_RUN_STATE_SUCCEEDED"
        code, out, _ = await cli(capsys, "graph", "cancel", "cli-run")
        assert code == 0 and "succeeded" in out  # an ended run is answered as it is
        code, _, err = await cli(capsys, "graph", "status", "nope")
        assert code == 1 and "--broker --reservation" in err
