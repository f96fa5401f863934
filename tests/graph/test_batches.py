"""Work elements a batch at a time inside a folded process (GF-5, GF-6).

A library component given a batch does what it does to each record given
one by one; the executor counts a batch's records and samples their sizes
exactly as it does record by record, and a call of a batch is what the
timing rule (each of the first 100 calls, then one in 1000) counts.
"""

from __future__ import annotations

import marshal
import os
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.graph.channels import _HEADER, ChannelWriter
from lightpath.graph.components import (
    BATCH,
    LIBRARY_CLASSES,
    ComponentError,
    Context,
    Record,
    numbers,
    record_size,
)
from lightpath.graph.examples import read_records, write_records
from lightpath.graph.executor import TIMED_EVERY, TIMED_FIRST, _count, run_set
from lightpath.graph.expand import expand
from lightpath.graph.fold import fold
from lightpath.graph.spec import ComponentSpec, DatasetSpec, Folding, GraphSpec, flow
from tests.graph.test_executor import recording

REGIONS = ("eu", "us", "apac", "EU")
records_st = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(0, 10**6).map(str),
            "region": st.sampled_from(REGIONS),
            "name": st.text("abcXYZ é", max_size=6),
            "amount": st.one_of(
                st.integers(-50, 999).map(str),
                st.floats(-5, 5, allow_nan=False).map(repr),
                st.sampled_from(["9007199254740993", " 7 ", "1_000", "-0"]),
            ),
        }
    ),
    max_size=60,
)

# (kind, params, output ports): every record component of the library.
CASES = [
    ("filter", {"where": "amount < 500"}, ("out", "reject")),
    ("filter", {"where": "amount >= 1.5"}, ("out", "reject")),
    ("filter", {"where": "amount == 7"}, ("out", "reject")),
    ("filter", {"where": "amount != 7"}, ("out",)),
    ("filter", {"where": "region == eu"}, ("out", "reject")),
    ("filter", {"where": "region > eu"}, ("reject",)),
    ("filter", {"where": "name ~ a"}, ("out", "reject")),
    ("filter", {"where": "missing <= 3"}, ("out",)),
    ("reformat", {"set": "path=c", "keep": "id,region,name,amount,path"}, ("out",)),
    ("reformat", {"keep": "id,name,amount", "upper": "name"}, ("out",)),
    ("reformat", {"set": "name=x,name=y", "keep": "name,id"}, ("out",)),
    ("reformat", {"rename": "name:who,amount:n", "lower": "who", "set": "k=v"}, ("out",)),
    ("reformat", {"rename": "region:r", "keep": "r,region"}, ("out",)),
    ("reformat", {"keep": "id,nothere"}, ("out",)),
    ("replicate", {}, ("out",)),
    ("gather", {}, ("out",)),
    ("hash_rollup", {"key": "region", "sum": "amount"}, ("out",)),
    ("hash_rollup", {"key": "region,name", "sum": "amount,id"}, ("out",)),
    ("hash_rollup", {"key": "region"}, ("out",)),
    ("sort", {"key": "id", "numeric": "true"}, ("out",)),
    ("sort", {"key": "region,name", "reverse": "true"}, ("out",)),
    ("sort", {"key": "amount", "numeric": "true"}, ("out",)),
    ("sort", {"key": "region", "reverse": "true"}, ("out",)),
    ("sort", {"key": "region,amount", "numeric": "true"}, ("out",)),
    ("sort", {"key": "nothere"}, ("out",)),
]


def _drive(kind: str, params: dict, ports: tuple, records: list[Record], cuts: list[int] | None):
    """Run one component over `records`, one by one (cuts None) or in batches cut at `cuts`.

    Returns what each output port got, in order, or the error it raised."""
    comp = LIBRARY_CLASSES[kind](params, Context("c"))
    got: dict[str, list[Record]] = {p: [] for p in ports}
    for p in ports:
        comp.outputs[p] = got[p].append
        comp.batch_outputs[p] = got[p].extend
    try:
        comp.start()
        if cuts is None:
            for r in records:
                comp.compute("in", r)
        else:
            bounds = [0, *sorted(c % (len(records) + 1) for c in cuts), len(records)]
            for a, b in pairwise(bounds):
                if b > a:
                    comp.compute_batch("in", records[a:b])
        comp.shutdown()
    except ComponentError as exc:
        return ("error", str(exc))
    return got


@settings(max_examples=60)
@given(
    case=st.sampled_from(CASES),
    records=records_st,
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
def test_a_component_does_to_a_batch_what_it_does_to_each_record(case, records, cuts):
    kind, params, ports = case
    one_by_one = _drive(kind, params, ports, records, None)
    batched = _drive(kind, params, ports, records, cuts)
    if isinstance(one_by_one, tuple):
        # The same error, naming the same cause (which record raises it may differ).
        assert isinstance(batched, tuple) and batched[1] == one_by_one[1]
    else:
        assert batched == one_by_one


@given(sizes=st.lists(st.integers(1, 2500), min_size=1, max_size=12))
def test_a_flow_samples_the_same_records_in_batches_as_one_by_one(sizes):
    records = [{"id": str(i), "v": "x" * (i % 7)} for i in range(sum(sizes))]
    expected = [0, 0, 0]
    for k, r in enumerate(records, 1):
        expected[0] += 1
        if k <= TIMED_FIRST or k % TIMED_EVERY == 0:
            expected[1] += 1
            expected[2] += record_size(r)
    counts = [0, 0, 0]
    at = 0
    for n in sizes:
        _count(counts, records[at : at + n])
        at += n
    assert counts == expected


def _filter_graph(tmp_path) -> tuple:
    spec = GraphSpec(
        "g",
        datasets=(
            DatasetSpec("in", str(tmp_path / "in.tsv")),
            DatasetSpec("out", str(tmp_path / "out.tsv")),
        ),
        components=(ComponentSpec("f", "filter", params={"where": "amount < 500"}),),
        flows=(flow("in", "f"), flow("f:out", "out")),
    )
    graph = expand(spec)
    (the_set,) = fold(graph).folded_sets
    return graph, the_set.members


@pytest.mark.parametrize(
    ("batch", "calls", "timed"),
    [
        (1024, 3, 3),  # 2500 records in batches of 1024, 1024, 452: every call among the first 100
        (1, 2500, TIMED_FIRST + 2),  # calls 1..100, 1000 and 2000
    ],
)
def test_a_member_taking_batches_is_called_and_timed_per_batch(tmp_path, batch, calls, timed):
    size = write_records(tmp_path / "in.tsv", 2500)
    graph, members = _filter_graph(tmp_path)
    report = run_set(graph, members, batch=batch)
    f = report.members["f"]
    assert (f["records"], f["calls"], f["timed_calls"]) == (2500, calls, timed)
    assert f["timed_records"] == (2500 if batch > 1 else timed)
    assert report.flows[0] == {"records": 2500, "bytes": size, "crosses": False}
    kept = [r for r in read_records(tmp_path / "in.tsv") if int(r["amount"]) < 500]
    assert read_records(tmp_path / "out.tsv") == kept
    assert report.flows[1]["records"] == len(kept)


def test_a_malformed_line_inside_a_batch_stops_the_root_after_the_lines_before_it(tmp_path):
    write_records(tmp_path / "in.tsv", 1500)
    lines = (tmp_path / "in.tsv").read_text().splitlines(keepends=True)
    lines[1201] = lines[1201].rstrip("\n") + "\textra\n"  # record 1201 (line 1 is the header)
    (tmp_path / "in.tsv").write_text("".join(lines))
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(
            ComponentSpec(
                "a",
                "tests.graph.kinds:Recorder",
                folding=Folding.ROOT_OR_INTERIOR,
                input_ports=("in",),
                output_ports=(),
            ),
        ),
        flows=(flow("in", "a"),),
    )
    graph = expand(spec)
    log: list = []
    with pytest.raises(Exception) as err:
        run_set(graph, ["a"], factory=recording(log))
    offset = len("".join(lines[:1201]))
    assert f"line after byte {offset} has 5 fields, the header 4" in str(err.value)
    assert [e[3] for e in log if e[0] == "compute"] == [str(i) for i in range(1200)]


def test_a_channel_frames_a_batch_as_it_frames_records_one_by_one():
    read_end, write_end = os.pipe()
    w = ChannelWriter(write_end, batch=4)
    records = [{"id": str(i)} for i in range(11)]
    w.write_batch(records[:3])
    w.write_batch(records[3:10])  # 10 buffered: two full frames, 2 kept
    w(records[10])
    w.end()
    data = os.read(read_end, 1 << 16)
    os.close(read_end)
    frames = []
    pos = 0
    while pos < len(data):
        kind, length = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
        frames.append((kind, marshal.loads(payload) if length else None))
        pos += _HEADER.size + length
    assert frames == [
        (b"R", records[0:4]),
        (b"R", records[4:8]),
        (b"R", records[8:11]),
        (b"E", None),
    ]


def test_a_multi_input_member_taking_batches_gets_a_batch_from_each_input_in_turn(tmp_path):
    write_records(tmp_path / "in.tsv", 3000)
    spec = GraphSpec(
        "g",
        datasets=(DatasetSpec("in", str(tmp_path / "in.tsv")),),
        components=(
            ComponentSpec("s", "replicate"),
            ComponentSpec("f1", "filter", params={"where": "amount < 500"}),
            ComponentSpec("f2", "filter", params={"where": "region == eu"}),
            ComponentSpec(
                "m",
                "tests.graph.kinds:BatchRecorder",
                folding=Folding.ROOT_OR_INTERIOR,
                input_ports=("left", "right"),
                output_ports=(),
            ),
        ),
        flows=(
            flow("in", "s"),
            flow("s", "f1"),
            flow("s", "f2"),
            flow("f1:out", "m:left"),
            flow("f2:out", "m:right"),
        ),
    )
    graph = expand(spec)
    (the_set,) = fold(graph).folded_sets
    log: list = []
    report = run_set(graph, the_set.members, factory=recording(log))
    calls = [(e[2], e[3]) for e in log if e[:2] == ("batch", "m")]
    # Expected: per batch the reader emits, each filter's selection joins its
    # queue; while both queues hold data, m gets as many records as the
    # shorter holds from left, then from right; at shutdown the rest, input by input.
    records = read_records(tmp_path / "in.tsv")
    expected: list[tuple[str, list[str]]] = []
    left: list[str] = []
    right: list[str] = []
    for at in range(0, len(records), BATCH):
        batch = records[at : at + BATCH]
        left += [r["id"] for r in batch if int(r["amount"]) < 500]
        right += [r["id"] for r in batch if r["region"] == "eu"]
        if left and right:
            k = min(len(left), len(right))
            expected += [("left", left[:k]), ("right", right[:k])]
            left, right = left[k:], right[k:]
    expected += [(port, rest) for port, rest in (("left", left), ("right", right)) if rest]
    assert calls == expected
    assert log.index(("shutdown", "m")) > max(i for i, e in enumerate(log) if e[0] == "batch")
    assert report.members["m"]["calls"] == len(expected)
    assert report.members["m"]["records"] == sum(len(ids) for _, ids in expected)


number_texts = st.one_of(
    st.integers(-(10**20), 10**20).map(str),  # long ones float() rounds
    st.integers(-999, 999).map(lambda n: f" {n:+05d}\t"),  # signs, zeros, blanks
    st.integers(0, 10**6).map(lambda n: f"{n:_}"),
    st.sampled_from(["-0", "٣٤", "1e3", "nan", "-inf", "0.1", "9007199254740993", "x", ""]),
    st.floats(allow_nan=False).map(repr),
)


@given(st.lists(number_texts, max_size=8), st.floats(allow_nan=False))
def test_numbers_compare_and_order_as_float_reads_them(texts, other):
    try:
        expected = [float(t) for t in texts]
    except ValueError as exc:
        with pytest.raises(ValueError) as err:
            numbers(texts)
        assert str(err.value) == str(exc)
        return
    got = numbers(texts)
    # int == float compares exact values; a NaN is only itself.
    assert all(g == e or (g != g and e != e) for g, e in zip(got, expected, strict=True))
    assert [g < other for g in got] == [e < other for e in expected]
    assert sorted(range(len(got)), key=got.__getitem__) == sorted(
        range(len(expected)), key=expected.__getitem__
    )
