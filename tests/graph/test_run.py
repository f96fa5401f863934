"""Whole graphs as OS processes, folded and one process per component (GF-5, GF-6, GF-7)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from lightpath.graph.examples import fig2a, fig3a, read_records, write_records
from lightpath.graph.expand import expand
from lightpath.graph.fold import fold, unfold
from lightpath.graph.metrics import from_proto as metrics_from_proto
from lightpath.graph.metrics import to_proto as metrics_to_proto
from lightpath.graph.runner import GraphRunError, run_graph
from lightpath.graph.spec import (
    ComponentSpec,
    DatasetSpec,
    FlowKind,
    Folding,
    GraphSpec,
    flow,
)


def no_workers_left() -> bool:
    me = psutil.Process()
    return not [
        p for p in me.children(recursive=True) if "lightpath.graph.worker" in " ".join(p.cmdline())
    ]


def test_fig_2a_gives_identical_outputs_folded_and_one_process_per_component(tmp_path):
    write_records(tmp_path / "in.tsv", 3000)
    runs = {}
    for folded in (True, False):
        out = tmp_path / ("folded" if folded else "unfolded")
        runs[folded] = run_graph(
            fig2a(tmp_path / "in.tsv", out), folded=folded, run_dir=tmp_path / f"run-{folded}"
        )
        assert sorted(p.name for p in out.iterdir()) == ["206A.tsv", "206B.tsv", "206C.tsv"]
    for name in ("206A.tsv", "206B.tsv", "206C.tsv"):
        assert (tmp_path / "folded" / name).read_bytes() == (
            tmp_path / "unfolded" / name
        ).read_bytes()
    folded, unfolded = runs[True].metrics, runs[False].metrics
    assert (len(folded.processes), len(unfolded.processes)) == (3, 10)
    assert folded.records_read == unfolded.records_read == 3000
    # The same records cross every flow whichever way the graph ran (GF-6).
    assert [f.records for f in folded.flows] == [f.records for f in unfolded.flows]
    by_name = {f.name: f for f in folded.flows}
    assert by_name["204F.out -> 204H.in"].crosses_processes
    assert not by_name["204A.out -> 204B.in"].crosses_processes
    between_components = [
        f
        for f in unfolded.flows
        if f.source.port and f.target.port  # datasets have no ports
    ]
    assert len(between_components) == 10
    assert all(f.crosses_processes for f in between_components)
    a = folded.component("204A")
    assert (a.records_in, a.folded_set) == (3000, "set-0")
    assert (
        a.records_out == folded.component("204B").records_in + folded.component("204C").records_in
    )
    assert folded.component("204H").cpu_method == "process"
    assert all(c.cpu_seconds > 0 for c in folded.components if c.folded_set == "set-0")
    assert metrics_from_proto(metrics_to_proto(folded)) == folded
    assert no_workers_left()


def test_fig_3a_runs_as_n_processes_with_the_same_partitions_as_unfolded(tmp_path):
    n = 3
    for part in range(n):
        write_records(tmp_path / f"in.{part}.tsv", 400, seed=part, start=1000 * part)
    outputs = {}
    for folded in (True, False):
        result = run_graph(
            fig3a(str(tmp_path / "in.{part}.tsv"), str(tmp_path / f"out-{folded}.{{part}}.tsv"), n),
            folded=folded,
            run_dir=tmp_path / f"run-{folded}",
        )
        assert len(result.metrics.processes) == (n if folded else 3 * n)
        outputs[folded] = [(tmp_path / f"out-{folded}.{p}.tsv").read_text() for p in range(n)]
    assert outputs[True] == outputs[False]
    first = read_records(tmp_path / "out-True.0.tsv")
    assert first and all(int(r["amount"]) >= 100 and r["seen"] == "1" for r in first)
    assert [int(r["id"]) for r in first] == sorted(int(r["id"]) for r in first)


def test_repartitioning_flows_spread_keys_over_instances_and_gather_them_back(tmp_path):
    write_records(tmp_path / "in.tsv", 2000)
    spec = GraphSpec(
        "repartition",
        datasets=(DatasetSpec("out", str(tmp_path / "out.tsv")),),
        components=(
            ComponentSpec("read", "file_input", params={"path": str(tmp_path / "in.tsv")}),
            ComponentSpec(
                "roll", "hash_rollup", degree=3, params={"key": "region", "sum": "amount"}
            ),
            ComponentSpec("order", "sort", params={"key": "region"}),
        ),
        flows=(
            flow("read", "roll", FlowKind.REPARTITION, "region"),
            flow("roll", "order", FlowKind.REPARTITION),
            flow("order", "out"),
        ),
    )
    result = run_graph(spec, run_dir=tmp_path / "run")
    assert [(s.members, s.degree) for s in result.plan.folded_sets] == [
        (("read",), 1),
        (("roll",), 3),
        (("order",), 1),
    ]
    expected: dict[str, tuple[int, int]] = {}
    for r in read_records(tmp_path / "in.tsv"):
        c, t = expected.get(r["region"], (0, 0))
        expected[r["region"]] = (c + 1, t + int(r["amount"]))
    rows = read_records(tmp_path / "out.tsv")
    # Each region was rolled up by exactly one of the three instances.
    assert [r["region"] for r in rows] == sorted(expected)
    assert {r["region"]: (int(r["count"]), int(r["sum_amount"])) for r in rows} == expected
    assert len([p for p in result.metrics.processes if p.folded_set == "set-1"]) == 3


def test_checkpoints_align_across_repartitioned_channels_and_resume(tmp_path):
    write_records(tmp_path / "in.tsv", 3000)

    def spec(out: str, flag: Path) -> GraphSpec:
        return GraphSpec(
            "aligned",
            datasets=(DatasetSpec("out", str(tmp_path / out)),),
            components=(
                ComponentSpec("read", "file_input", params={"path": str(tmp_path / "in.tsv")}),
                ComponentSpec(
                    "crash",
                    "tests.graph.kinds:CrashOnce",
                    folding=Folding.ROOT_OR_INTERIOR,
                    degree=3,
                    input_ports=("in",),
                    output_ports=("out",),
                    params={
                        "at": "700",
                        "flag": str(flag),
                        "how": "exit",
                        # read x1, crash+roll x3, order x1: crash after all five saved one
                        "wait_for": f"{tmp_path / 'run' / 'checkpoints'}:5",
                    },
                ),
                ComponentSpec(
                    "roll", "hash_rollup", degree=3, params={"key": "name", "sum": "amount"}
                ),
                ComponentSpec("order", "sort", params={"key": "name"}),
            ),
            flows=(
                flow("read", "crash", FlowKind.REPARTITION, "name"),
                flow("crash", "roll"),
                flow("roll", "order", FlowKind.REPARTITION),
                flow("order", "out"),
            ),
        )

    run_graph(spec("clean.tsv", tmp_path / "never"), run_dir=tmp_path / "c")
    flag = tmp_path / "crash-once"
    flag.touch()
    with pytest.raises(GraphRunError, match="exited with status 9"):
        run_graph(spec("out.tsv", flag), run_dir=tmp_path / "run", checkpoint_every=200)
    result = run_graph(
        spec("out.tsv", flag), run_dir=tmp_path / "run", checkpoint_every=200, resume=True
    )
    assert result.resumed_from[0] >= 1
    assert (tmp_path / "out.tsv").read_text() == (tmp_path / "clean.tsv").read_text()
    assert result.metrics.component("roll").records_in == 3000


def test_a_later_phase_reads_what_the_earlier_phase_spilled(tmp_path):
    write_records(tmp_path / "in.tsv", 500)
    spec = GraphSpec(
        "phases",
        datasets=(
            DatasetSpec("in", str(tmp_path / "in.tsv")),
            DatasetSpec("out", str(tmp_path / "out.tsv")),
        ),
        components=(
            ComponentSpec("keep", "filter", params={"where": "amount < 500"}),
            ComponentSpec("order", "sort", phase=1, params={"key": "amount,id", "numeric": "true"}),
        ),
        flows=(flow("in", "keep"), flow("keep:out", "order"), flow("order", "out")),
    )
    result = run_graph(spec, run_dir=tmp_path / "run")
    assert [s.phase for s in result.plan.folded_sets] == [0, 1]
    rows = read_records(tmp_path / "out.tsv")
    source = [r for r in read_records(tmp_path / "in.tsv") if int(r["amount"]) < 500]
    assert rows == sorted(source, key=lambda r: (int(r["amount"]), int(r["id"])))
    assert list((tmp_path / "run" / "spill").iterdir())


def _crashy_fig(tmp_path: Path, out: str, flag: Path, how: str, wait_for: str = "") -> GraphSpec:
    base = fig2a(tmp_path / "in.tsv", tmp_path / out)
    params = {"at": "1300", "flag": str(flag), "how": how}
    if wait_for:
        params["wait_for"] = wait_for
    crash = ComponentSpec(
        "crash",
        "tests.graph.kinds:CrashOnce",
        folding=Folding.ROOT_OR_INTERIOR,
        input_ports=("in",),
        output_ports=("out",),
        params=params,
    )
    # Insert the crashing pass-through between 204I and 204J (set {204I, crash, 204J}).
    kept = [f for f in base.flows if (f.source.node, f.target.node) != ("204I", "204J")]
    flows = (*kept, flow("204I", "crash"), flow("crash", "204J"))
    return GraphSpec(base.graph_id, (*base.components, crash), flows, base.datasets)


@pytest.mark.parametrize("folded", [True, False])
def test_a_killed_process_resumes_from_the_last_complete_checkpoint(tmp_path, folded):
    write_records(tmp_path / "in.tsv", 2400)
    run_graph(_crashy_fig(tmp_path, "clean", tmp_path / "never", "exit"), run_dir=tmp_path / "c")
    flag = tmp_path / "crash-once"
    flag.touch()
    checkpoints = tmp_path / "run" / "checkpoints"
    probe = _crashy_fig(tmp_path, "crashed", flag, "exit")
    graph = expand(probe)
    instances = sum(s.degree for s in (fold(graph) if folded else unfold(graph)).folded_sets)
    # The crash waits until every process saved a checkpoint, so there is one to resume from.
    spec = _crashy_fig(tmp_path, "crashed", flag, "exit", wait_for=f"{checkpoints}:{instances}")
    with pytest.raises(GraphRunError) as err:
        run_graph(spec, folded=folded, run_dir=tmp_path / "run", checkpoint_every=500)
    assert "exited with status 9" in err.value.message
    assert no_workers_left()
    saved: dict[str, set[int]] = {}
    for p in checkpoints.glob("*.ckpt"):  # not a .tmp a killed save left
        instance, ckpt = p.name.rsplit(".", 2)[0], int(p.name.split(".")[-2])
        saved.setdefault(instance, set()).add(ckpt)
    assert len(saved) == instances
    complete = set.intersection(*saved.values())
    result = run_graph(
        spec, folded=folded, run_dir=tmp_path / "run", checkpoint_every=500, resume=True
    )
    # from the latest checkpoint every process saved, not from scratch
    assert result.resumed_from[0] == max(complete) >= 1
    for name in ("206A.tsv", "206B.tsv", "206C.tsv"):
        assert (tmp_path / "crashed" / name).read_bytes() == (
            tmp_path / "clean" / name
        ).read_bytes()


def test_an_error_stops_every_process_and_names_the_component(tmp_path):
    write_records(tmp_path / "in.tsv", 3000)
    flag = tmp_path / "crash-once"
    flag.touch()
    with pytest.raises(GraphRunError) as err:
        run_graph(_crashy_fig(tmp_path, "out", flag, "error"), run_dir=tmp_path / "run")
    assert err.value.component == "crash"
    assert err.value.message == "crashed on purpose at record 1300"
    assert no_workers_left()


def test_an_interface_program_that_fails_is_reported_by_the_interface(tmp_path):
    write_records(tmp_path / "in.tsv", 100)
    spec = fig2a(tmp_path / "in.tsv", tmp_path / "out", interface_command="sh -c 'cat; exit 3'")
    with pytest.raises(GraphRunError) as err:
        run_graph(spec, run_dir=tmp_path / "run")
    assert err.value.component == "204H"
    assert "exited with status 3" in err.value.message
    missing = fig2a(tmp_path / "in.tsv", tmp_path / "out", interface_command="no-such-program-x")
    with pytest.raises(GraphRunError) as err:
        run_graph(missing, run_dir=tmp_path / "run")
    assert (err.value.component, err.value.message) == (
        "204H",
        "cannot start no-such-program-x: No such file or directory",
    )
