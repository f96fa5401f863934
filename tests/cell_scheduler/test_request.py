"""A submission checked against the cell's pods with the pods' own rules (CS-2, CS-4)."""

from __future__ import annotations

import pytest

from lightpath.errors import InvalidArgument
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.cell_scheduler.choice import chips_key
from lightpath_services.cell_scheduler.request import (
    PodModel,
    check_request,
    no_pod_can_host,
    resolve,
    resolve_all,
)

TORUS = PodModel("pod-1", c.FABRIC_KIND_OCS_TORUS, (4, 4, 4), (("tpu", 60), ("gpu", 4)))
SMALL = PodModel("pod-2", c.FABRIC_KIND_OCS_TORUS, (4, 4, 4), (("tpu", 8),))
SWITCHED = PodModel("pod-s", c.FABRIC_KIND_SWITCHED, (3, 3), (("npu", 16),))
FLOPS = {"tpu": 275e12}


def req(**spec) -> cs.SubmitJobRequest:
    demand = spec.pop("demand", None)
    tenant = spec.pop("tenant", "")
    return cs.SubmitJobRequest(spec=ws.JobSpec(job_id="j", **spec), demand=demand, tenant=tenant)


def test_a_torus_pod_takes_blocks_per_node_type_and_gets_the_spec_with_the_tenant():
    r = resolve(
        req(shape=c.Shape(dims=[8, 8, 4]), node_type_counts={"tpu": 2, "gpu": 2}, tenant="acme"),
        TORUS,
        now_ms=0,
        node_flops=FLOPS,
    )
    assert dict(r.needs) == {"tpu": 2, "gpu": 2} and r.grid == (2, 2, 1) and r.chips == (8, 8, 4)
    assert r.spec.labels["tenant"] == "acme"
    assert r.spec.when_no_capacity == ws.WHEN_NO_CAPACITY_FAIL  # the cell keeps waiting jobs


def test_what_no_pod_can_host_is_refused_with_each_pods_reason():
    ok, bad = resolve_all(
        req(shape=c.Shape(dims=[4, 4, 4]), node_types=["gpu"]),
        {"pod-1": TORUS, "pod-2": SMALL},
        now_ms=0,
        node_flops=FLOPS,
    )
    assert set(ok) == {"pod-1"} and "unknown node type 'gpu'" in bad["pod-2"].message
    _, bad = resolve_all(
        req(shape=c.Shape(dims=[6, 4, 4])),
        {"pod-1": TORUS, "pod-2": SMALL},
        now_ms=0,
        node_flops={},
    )
    err = no_pod_can_host(bad)  # the same rule on both pods: said once
    assert [v.field for v in err.violations] == ["spec.shape.dims[0]"]
    _, bad = resolve_all(
        req(shape=c.Shape(dims=[16, 16, 20])),
        {"pod-1": TORUS, "pod-2": SMALL},
        now_ms=0,
        node_flops={},
    )
    err = no_pod_can_host(bad)  # different per pod: each with its pod
    assert err.reason == "MORE_BLOCKS_THAN_POD"
    assert any("(pod pod-2)" in v.rule for v in err.violations)


def test_a_demand_is_sized_for_each_pods_blocks_until_the_deadline():
    d = cs.ComputeDemand(flops=128 * 275e12 * 3600, node_type="tpu")
    d.deadline.FromMilliseconds(3_600_000)
    r = resolve(req(demand=d), TORUS, now_ms=0, node_flops=FLOPS)
    assert r.derived is not None and r.grid == (1, 1, 2) and dict(r.needs) == {"tpu": 2}
    assert list(r.spec.shape.dims) == [1, 1, 2] and r.spec.unit == c.SHAPE_UNIT_BLOCKS
    # Half the time left: twice the chips.
    r = resolve(req(demand=d), TORUS, now_ms=1_800_000, node_flops=FLOPS)
    assert r.block_count == 4
    with pytest.raises(InvalidArgument) as err:
        resolve(req(demand=d), TORUS, now_ms=3_600_000, node_flops=FLOPS)
    assert err.value.violations[0].field == "demand.deadline"


def test_request_rules_that_hold_whatever_the_pods():
    d = cs.ComputeDemand(flops=1e20)
    fields = {v.field for v in check_request(req(shape=c.Shape(dims=[4, 4, 4]), demand=d), FLOPS)}
    assert fields == {"spec.shape", "demand.deadline"}
    d = cs.ComputeDemand(flops=1e20, chip_hours=5, node_type="Bad Type")
    d.deadline.FromSeconds(10)
    fields = {v.field for v in check_request(req(demand=d), FLOPS)}
    assert fields == {"demand", "demand.node_type"}
    d = cs.ComputeDemand(flops=1e20, node_type="gpu")
    d.deadline.FromSeconds(10)
    (v,) = check_request(req(demand=d), FLOPS)
    assert v.field == "demand.node_type" and "no throughput is configured" in v.rule


def test_a_switched_pod_counts_processor_groups_from_the_degrees():
    r = resolve(
        req(parallelism=c.ParallelismDegrees(data=4, pipeline=3, layer=3)),
        SWITCHED,
        now_ms=0,
        node_flops={},
    )
    assert dict(r.needs) == {"npu": 4} and r.chips == (36,)  # 36 processors, groups of 9
    small = resolve(
        req(parallelism=c.ParallelismDegrees(data=2)), SWITCHED, now_ms=0, node_flops={}
    )
    assert dict(small.needs) == {"npu": 1}
    with pytest.raises(InvalidArgument) as err:
        resolve(req(shape=c.Shape(dims=[3, 3])), SWITCHED, now_ms=0, node_flops={})
    assert err.value.violations[0].field == "spec.parallelism"
    with pytest.raises(InvalidArgument) as err:
        resolve(req(parallelism=c.ParallelismDegrees(data=200)), SWITCHED, now_ms=0, node_flops={})
    assert err.value.reason == "MORE_BLOCKS_THAN_POD"
    # In a cell of both kinds, each pod is asked for what it understands.
    ok, bad = resolve_all(
        req(parallelism=c.ParallelismDegrees(data=8, pipeline=2)),
        {"pod-2": SMALL, "pod-s": SWITCHED},
        now_ms=0,
        node_flops={},
    )
    assert set(ok) == {"pod-s"} and bad["pod-2"].violations[0].field == "spec.shape"


def test_a_shape_inside_one_block_is_a_sub_block_slice_counted_in_chips():
    # Issue 28: 2x2x1 chips of a 4x4x4 block is not refused as "not a multiple of the
    # block"; the cell counts it as 4 tpu chips, never as a block.
    r = resolve(req(shape=c.Shape(dims=[2, 2, 1])), TORUS, now_ms=0, node_flops=FLOPS)
    assert r.sub_block and dict(r.needs) == {chips_key("tpu"): 4}
    assert r.chips == (2, 2, 1) and r.block_count == 0
    assert list(r.spec.shape.dims) == [2, 2, 1]  # forwarded as asked
    gpu = resolve(
        req(shape=c.Shape(dims=[1, 1, 1]), node_types=["gpu"]), TORUS, now_ms=0, node_flops=FLOPS
    )
    assert dict(gpu.needs) == {chips_key("gpu"): 1}


def test_a_sub_block_slice_that_asks_for_a_twist_or_wraparound_is_refused_naming_the_field():
    ok, bad = resolve_all(
        req(shape=c.Shape(dims=[2, 2, 1]), twisted=True), {"pod-1": TORUS}, now_ms=0, node_flops={}
    )
    assert not ok
    err = no_pod_can_host(bad)
    assert [v.field for v in err.violations] == ["spec.twisted"]
    assert "fits inside one block" in err.violations[0].rule


def test_a_twisted_torus_goes_through_and_takes_its_blocks():
    r = resolve(req(shape=c.Shape(dims=[4, 4, 8]), twisted=True), TORUS, now_ms=0, node_flops=FLOPS)
    assert r.spec.twisted and dict(r.needs) == {"tpu": 2} and not r.sub_block
    with pytest.raises(InvalidArgument) as err:
        resolve(req(shape=c.Shape(dims=[4, 8, 12]), twisted=True), TORUS, now_ms=0, node_flops={})
    assert err.value.violations[0].field == "spec.twisted"


def test_a_small_demand_is_sized_to_a_box_of_chips_not_a_whole_block():
    # 3 chip-hours due in an hour: 3 chips -> a 1x2x2 box (extents dividing the block's).
    d = cs.ComputeDemand(chip_hours=3, node_type="tpu")
    d.deadline.FromMilliseconds(3_600_000)
    r = resolve(req(demand=d), TORUS, now_ms=0, node_flops=FLOPS)
    assert r.derived is not None and r.derived.sub_block and r.sub_block
    assert list(r.spec.shape.dims) == [1, 2, 2] and r.spec.unit == c.SHAPE_UNIT_CHIPS
    assert dict(r.needs) == {chips_key("tpu"): 4} and r.block_count == 0
