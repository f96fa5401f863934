"""`lightpath graph plan | run | example` (X-6: every read has --json)."""

from __future__ import annotations

import json

from lightpath.cli import main


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
    assert metrics["records_read"] == "300"  # uint64 is a string in protobuf JSON
    assert [c["component"] for c in metrics["components"]] == ["304A", "304B", "304C"]
    assert {p["folded_set"] for p in metrics["processes"]} == {"set-0"}
    assert len(metrics["processes"]) == 2
    assert (tmp_path / "out" / "306.0.tsv").exists() and (tmp_path / "out" / "306.1.tsv").exists()
