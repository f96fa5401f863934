"""The folded executor in one process (GF-5) and its monitoring (GF-6)."""

from __future__ import annotations

import marshal
import os
import pickle
from pathlib import Path

import pytest
import redis

from lightpath.graph.channels import _HEADER, BLIP
from lightpath.graph.components import Context
from lightpath.graph.examples import read_records, write_records
from lightpath.graph.executor import (
    CheckpointStore,
    ComponentFailure,
    FoldedExecutor,
    library_factory,
    run_set,
)
from lightpath.graph.expand import Node, expand
from lightpath.graph.fold import fold
from lightpath.graph.spec import (
    ComponentSpec,
    DatasetSpec,
    Folding,
    GraphSpec,
    flow,
)
from tests.graph.kinds import Recorder

RECORDER = "tests.graph.kinds:Recorder"


def rec(id: str, *, ins=("in",), outs=("out",), **params: str) -> ComponentSpec:
    return ComponentSpec(
        id,
        RECORDER,
        folding=Folding.ROOT_OR_INTERIOR,
        input_ports=ins,
        output_ports=outs,
        params=params,
    )


def recording(log: list):
    def factory(node: Node, context: Context):
        comp = library_factory(node, context)
        if isinstance(comp, Recorder):
            comp.log = log
        return comp

    return factory


def only_set(spec: GraphSpec):
    graph = expand(spec)
    (the_set,) = fold(graph).folded_sets
    return graph, the_set.members


# ---------------------------------------------------------------- shutdown, blips


def test_shutdown_runs_in_topological_order_and_a_hash_rollup_emits_at_shutdown(tmp_path):
    write_records(tmp_path / "in.tsv", 40)
    spec = GraphSpec(
        "g",
        datasets=(
            DatasetSpec("in", str(tmp_path / "in.tsv")),
            DatasetSpec("out", str(tmp_path / "out.tsv")),
            DatasetSpec("out2", str(tmp_path / "out2.tsv")),
        ),
        components=(
            rec("a"),
            ComponentSpec("r", "hash_rollup", params={"key": "region", "sum": "amount"}),
            rec("b", log_field="region"),
            rec("c"),
        ),
        flows=(
            flow("in", "a"),
            flow("a", "r"),
            flow("r", "b"),
            flow("b", "out"),
            flow("a", "c"),
            flow("c", "out2"),
        ),
    )
    graph, members = only_set(spec)
    log: list = []
    run_set(graph, members, factory=recording(log))
    shutdowns = [e[1] for e in log if e[0] == "shutdown"]
    assert shutdowns == ["a", "b", "c"]  # topological order a, r, b, c
    a_down = log.index(("shutdown", "a"))
    b_inputs = [i for i, e in enumerate(log) if e[:2] == ("compute", "b")]
    # b hears from the rollup only after a (upstream of r) shut down, and before its own shutdown.
    assert b_inputs and min(b_inputs) > a_down
    assert max(b_inputs) < log.index(("shutdown", "b"))
    records = read_records(tmp_path / "in.tsv")
    expected = {}
    for r in records:
        count, total = expected.get(r["region"], (0, 0))
        expected[r["region"]] = (count + 1, total + int(r["amount"]))
    rolled = read_records(tmp_path / "out.tsv")
    assert {r["region"]: (int(r["count"]), int(r["sum_amount"])) for r in rolled} == expected
    assert [r["region"] for r in rolled] == sorted(expected)
    assert len(read_records(tmp_path / "out2.tsv")) == 40


def test_blips_pass_members_in_topological_order_and_a_checkpoint_is_one_file_before_the_blip_leaves(
    tmp_path,
):
    write_records(tmp_path / "in.tsv", 10)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(rec("a"), rec("b"), rec("c"), rec("d", outs=())),
        flows=(flow("in", "a"), flow("a", "b"), flow("b", "c"), flow("c", "d")),
        pins=(),
    )
    graph = expand(spec)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    seen_at_checkpoint: dict[int, bytes] = {}
    channel = bytearray()

    def on_checkpoint(k: int) -> None:
        try:
            channel.extend(os.read(read_end, 1 << 20))
        except BlockingIOError:
            pass
        seen_at_checkpoint[k] = bytes(channel)

    c_to_d = next(f.index for f in graph.flows if f.source.node == "c")
    store = CheckpointStore(tmp_path / "ckpt", "set-0", 0)
    log: list = []
    report = FoldedExecutor(
        graph,
        ["a", "b", "c"],
        channels_out={c_to_d: [write_end]},
        factory=recording(log),
        checkpoints=store,
        checkpoint_every=4,
        on_checkpoint=on_checkpoint,
    ).run()
    channel.extend(os.read(read_end, 1 << 20))
    os.close(read_end)

    assert report.checkpoints == [1, 2]
    for k in (1, 2):
        i = log.index(("blip", "a", k))
        assert log[i : i + 3] == [("blip", "a", k), ("blip", "b", k), ("blip", "c", k)]
        # Every record before the blip reached c before the blip started.
        before = [e[3] for e in log[:i] if e[:2] == ("compute", "c")]
        assert before == [str(n) for n in range(4 * k)]
    # One file per checkpoint, holding every member's state and the reader's position.
    assert store.saved() == [1, 2]
    state = pickle.loads(store.path(2).read_bytes())
    assert state["members"] == {"a": 8, "b": 8, "c": 8}
    assert state["sources"][0]["records"] == 8
    # Each blip reached the channel only after its checkpoint was saved, after the records before it.
    assert [k for k, _ in frames(seen_at_checkpoint[1]) if k == BLIP] == []
    assert [p for k, p in frames(seen_at_checkpoint[2]) if k == BLIP] == [("checkpoint", 1)]
    kinds = [(k, p if k == BLIP else len(p)) for k, p in frames(bytes(channel))]
    assert kinds == [
        (b"R", 4),
        (BLIP, ("checkpoint", 1)),
        (b"R", 4),
        (BLIP, ("checkpoint", 2)),
        (b"R", 2),
        (b"E", 0),
    ]


def frames(data: bytes) -> list[tuple[bytes, object]]:
    out = []
    pos = 0
    while pos < len(data):
        kind, length = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
        out.append((kind, marshal.loads(payload) if payload else []))
        pos += _HEADER.size + length
    return out


def test_a_multi_input_member_is_called_only_while_every_input_has_data(tmp_path):
    write_records(tmp_path / "in.tsv", 6)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(
            ComponentSpec("s", "replicate"),
            rec("f1"),
            rec("f2", even_only="true"),
            rec("m", ins=("left", "right"), outs=()),
        ),
        flows=(
            flow("in", "s"),
            flow("s", "f1"),
            flow("s", "f2"),
            flow("f1", "m:left"),
            flow("f2", "m:right"),
        ),
    )
    graph, members = only_set(spec)
    assert set(members) == {"s", "f1", "f2", "m"}
    log: list = []
    run_set(graph, members, factory=recording(log))
    calls = [(e[2], e[3]) for e in log if e[:2] == ("compute", "m")]
    # Round robin while both inputs hold data; the rest at shutdown, input by input.
    assert calls == [
        ("left", "0"),
        ("right", "0"),
        ("left", "1"),
        ("right", "2"),
        ("left", "2"),
        ("right", "4"),
        ("left", "3"),
        ("left", "4"),
        ("left", "5"),
    ]
    assert log[-1] == ("shutdown", "m")


# ---------------------------------------------------------------- errors


def test_an_error_in_a_member_surfaces_naming_it(tmp_path):
    write_records(tmp_path / "in.tsv", 5)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(rec("a"), ComponentSpec("f", "filter", params={"where": "weight > 3"})),
        flows=(flow("in", "a"), flow("a", "f")),
    )
    graph, members = only_set(spec)
    with pytest.raises(ComponentFailure) as err:
        run_set(graph, members, factory=recording([]))
    assert err.value.component == "f"
    assert "record has no field 'weight'" in err.value.message


def test_a_root_answering_error_names_the_root(tmp_path):
    (tmp_path / "in.tsv").write_text("id\tname\n1\tok\n2\ttoo\tmany\n")
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(rec("a", outs=()),),
        flows=(flow("in", "a"),),
    )
    graph, members = only_set(spec)
    with pytest.raises(ComponentFailure) as err:
        run_set(graph, members, factory=recording([]))
    assert err.value.component == "a"
    assert "has 3 fields, the header 2" in err.value.message


# ---------------------------------------------------------------- checkpoint and resume


def _crashing_graph(tmp_path: Path, out: str, flag: Path) -> GraphSpec:
    return GraphSpec(
        "g",
        datasets=(
            DatasetSpec("in", str(tmp_path / "in.tsv")),
            DatasetSpec("sorted", str(tmp_path / out / "sorted.tsv")),
            DatasetSpec("rolled", str(tmp_path / out / "rolled.tsv")),
            DatasetSpec("passed", str(tmp_path / out / "passed.tsv")),
        ),
        components=(
            ComponentSpec(
                "crash",
                "tests.graph.kinds:CrashOnce",
                folding=Folding.ROOT_OR_INTERIOR,
                input_ports=("in",),
                output_ports=("out",),
                params={"at": "170", "flag": str(flag)},
            ),
            ComponentSpec("s", "sort", params={"key": "amount,id", "numeric": "true"}),
            ComponentSpec("r", "hash_rollup", params={"key": "region", "sum": "amount"}),
            ComponentSpec("f", "filter", params={"where": "amount < 300"}),
        ),
        flows=(
            flow("in", "crash"),
            flow("crash", "s"),
            flow("crash", "r"),
            flow("crash", "f"),
            flow("s", "sorted"),
            flow("r", "rolled"),
            flow("f:out", "passed"),
        ),
    )


def test_a_restart_from_the_checkpoint_gives_the_uninterrupted_output(tmp_path):
    write_records(tmp_path / "in.tsv", 250)
    flag = tmp_path / "crash-once"
    graph, members = only_set(_crashing_graph(tmp_path, "clean", tmp_path / "never"))
    run_set(graph, members)

    graph, members = only_set(_crashing_graph(tmp_path, "crashed", flag))
    store = CheckpointStore(tmp_path / "ckpt", "set-0", 0)
    flag.touch()
    with pytest.raises(ComponentFailure, match="crashed on purpose"):
        run_set(graph, members, checkpoints=store, checkpoint_every=50)
    assert store.saved() == [1, 2, 3]  # blips after 50, 100 and 150 records; crash at 170
    report = run_set(
        graph, members, checkpoints=store, checkpoint_every=50, resume_from=store.saved()[-1]
    )
    for name in ("sorted", "rolled", "passed"):
        clean = (tmp_path / "clean" / f"{name}.tsv").read_text()
        assert (tmp_path / "crashed" / f"{name}.tsv").read_text() == clean, name
    # Flow counts continue from the checkpoint: they describe the whole logical run.
    crash_in = next(i for i, f in enumerate(graph.flows) if f.target.node == "crash")
    assert report.flows[crash_in]["records"] == 250


# ---------------------------------------------------------------- monitoring (GF-6)


def test_calls_are_timed_first_100_then_one_in_1000_and_dataset_bytes_are_exact(tmp_path):
    size = write_records(tmp_path / "in.tsv", 2500)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(rec("a", outs=()),),
        flows=(flow("in", "a"),),
    )
    graph, members = only_set(spec)
    report = run_set(graph, members, factory=recording([]))
    assert report.members["a"]["calls"] == 2500
    assert report.members["a"]["timed_calls"] == 100 + 2  # calls 1..100, 1000 and 2000
    assert report.flows[0] == {"records": 2500, "bytes": size, "crosses": False}


def test_cpu_inside_a_folded_process_goes_to_the_member_that_spends_it(tmp_path):
    write_records(tmp_path / "in.tsv", 3000)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(
            rec("light", outs=("out",)),
            ComponentSpec(
                "heavy",
                "tests.graph.kinds:Spin",
                folding=Folding.ROOT_OR_INTERIOR,
                input_ports=("in",),
                output_ports=("out",),
                params={"loops": "3000"},
            ),
            rec("tail", outs=()),
        ),
        flows=(flow("in", "light"), flow("light", "heavy"), flow("heavy", "tail")),
    )
    graph, members = only_set(spec)
    report = run_set(graph, members, factory=recording([]), sample_interval=0.002)
    samples = {m: v["samples"] for m, v in report.members.items()}
    estimates = {m: v["estimate_ns"] for m, v in report.members.items()}
    assert samples["heavy"] > 0.7 * sum(samples.values())
    assert estimates["heavy"] > 0.7 * sum(estimates.values())
    # Nested calls are excluded: heavy's time is not also counted for light.
    assert estimates["light"] < estimates["heavy"] / 5


# ---------------------------------------------------------------- an external service


def test_a_lookup_split_in_request_and_response_halves_runs_in_one_process(tmp_path, redis_url):
    client = redis.Redis.from_url(redis_url)
    client.mset({f"user:{i}": f"name-{i}" for i in range(0, 300, 3)})
    write_records(tmp_path / "in.tsv", 300)
    spec = GraphSpec(
        "g",
        datasets=(
            DatasetSpec("in", str(tmp_path / "in.tsv")),
            DatasetSpec("out", str(tmp_path / "out.tsv")),
        ),
        components=(
            ComponentSpec("f", "filter", params={"where": "amount >= 0"}),
            ComponentSpec(
                "k",
                "kv_lookup",
                params={
                    "redis_url": redis_url,
                    "key_field": "id",
                    "key_prefix": "user:",
                    "into": "user",
                    "missing": "-",
                    "connections": "3",
                },
            ),
            ComponentSpec("r", "reformat", params={"keep": "id,user"}),
        ),
        flows=(flow("in", "f"), flow("f:out", "k"), flow("k", "r"), flow("r", "out")),
    )
    graph = expand(spec)
    (the_set,) = fold(graph).folded_sets
    assert the_set.roots == ("f", "k.response")
    report = run_set(graph, the_set.members)
    rows = read_records(tmp_path / "out.tsv")
    # In input order (answers from three connections are put back in order).
    assert [r["id"] for r in rows] == [str(i) for i in range(300)]
    assert all(r["user"] == (f"name-{r['id']}" if int(r["id"]) % 3 == 0 else "-") for r in rows)
    assert report.members["k.request"]["calls"] == 300
    assert report.members["r"]["calls"] == 300
