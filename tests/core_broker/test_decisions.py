"""The decision function on the seed's worked examples (001 Fig. 2-4, ¶24) and
on placement, priority and validation (CB-3 … CB-5, CB-7)."""

from __future__ import annotations

import pytest

from lightpath.errors import InvalidArgument, NotFound
from lightpath_services.core_broker.capacity import Allocation, CapacityMap, Device
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Group,
    Outcome,
    Placement,
    PriorityFunction,
    decide,
    decide_one,
    parse_weights,
    validate_request,
)

S = 1000  # ms
NOW = 1_700_000_000_000
PRIORITY = PriorityFunction()


def gpu(device_id: str = "gpu-1", cores: int = 80, **kw) -> Device:
    return Device(device_id, kw.pop("kind", "GPU"), cores, **kw)


def cap_of(*devices: Device) -> CapacityMap:
    cap = CapacityMap()
    for d in devices:
        cap.upsert_device(d)
    return cap


def high(rid: str, cores: int, seconds: float, **kw) -> CoreRequest:
    """A computer-vision request under a premium, committed agreement (¶34: high)."""
    return CoreRequest(
        rid,
        cores,
        int(seconds * S),
        task_type="computer-vision",
        qos_level="PREMIUM",
        billing_model="COMMITTED",
        priority_hint=80,
        **kw,
    )


def low(rid: str, cores: int, seconds: float, **kw) -> CoreRequest:
    """An ML-training request on best-effort spot terms (¶34: low)."""
    return CoreRequest(
        rid,
        cores,
        int(seconds * S),
        task_type="training",
        qos_level="BEST_EFFORT",
        billing_model="SPOT",
        priority_hint=20,
        **kw,
    )


def run(cap: CapacityMap, *requests: CoreRequest, now: int = NOW, **kw):
    return [
        ds[0]
        for ds in decide(cap, [Group((r,)) for r in requests], now=now, priority=PRIORITY, **kw)
    ]


def test_fig2_three_requests_of_25_21_and_10_cores_are_all_granted_for_their_ranges():
    cap = cap_of(gpu(cores=64))
    r1 = CoreRequest("req-202-1", 25, 10 * S, earliest_start=NOW, latest_end=NOW + 10 * S)
    r2 = CoreRequest("req-202-2", 21, 10 * S, earliest_start=NOW + 2 * S, latest_end=NOW + 12 * S)
    r3 = CoreRequest("req-202-n", 10, 4 * S, earliest_start=NOW + 5 * S, latest_end=NOW + 9 * S)
    d1, d2, d3 = run(cap, r1, r2, r3)
    assert [d.outcome for d in (d1, d2, d3)] == [Outcome.GRANTED] * 3
    assert d1.allocations == (Allocation("gpu-1", 25, NOW, NOW + 10 * S),)
    assert d2.allocations == (Allocation("gpu-1", 21, NOW + 2 * S, NOW + 12 * S),)
    assert d3.allocations == (Allocation("gpu-1", 10, NOW + 5 * S, NOW + 9 * S),)
    # the map itself is untouched: decide works on a fork
    assert len(cap) == 0


def test_fig3_the_higher_request_in_full_the_lower_30_now_and_20_when_the_higher_ends():
    cap = cap_of(gpu(cores=80))
    lower = low("req-302-n", 50, 10, accept=frozenset({Outcome.PARTIAL}))
    higher = high("req-302-1", 50, 10)
    # the lower arrives first; decided together, the higher is served first (CB-5)
    d_low, d_high = run(cap, lower, higher)
    assert PRIORITY(higher).score > PRIORITY(lower).score
    assert d_high.outcome is Outcome.GRANTED
    assert d_high.allocations == (Allocation("gpu-1", 50, NOW, NOW + 10 * S),)
    assert d_low.outcome is Outcome.PARTIAL
    assert d_low.allocations == (
        Allocation("gpu-1", 30, NOW, NOW + 10 * S),
        Allocation("gpu-1", 20, NOW + 10 * S, NOW + 20 * S),
    )
    assert d_low.cores_at_start == 30
    assert d_low.summary.startswith("30 cores now, 20 more in 10 s")


def test_fig4_the_lower_request_is_deferred_until_the_higher_one_ends():
    cap = cap_of(gpu(cores=80))
    lower = low("req-302-n", 50, 10, accept=frozenset({Outcome.DEFERRED}))
    higher = high("req-302-1", 50, 10)
    d_low, d_high = run(cap, lower, higher)
    assert d_high.outcome is Outcome.GRANTED
    assert d_low.outcome is Outcome.DEFERRED
    assert d_low.allocations == (Allocation("gpu-1", 50, NOW + 10 * S, NOW + 20 * S),)
    assert d_low.summary.startswith("50 cores in 10 s")


def test_para24_80_cores_now_and_the_120_remaining_in_15_s():
    cap = cap_of(gpu("gpu-1", 100), gpu("gpu-2", 100))
    cap.add("busy:0", "gpu-1", NOW - 60 * S, NOW + 15 * S, 70)
    cap.add("busy:1", "gpu-2", NOW - 60 * S, NOW + 15 * S, 50)
    d = decide_one(cap, CoreRequest("r200", 200, 600 * S), now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.PARTIAL
    assert d.cores_at_start == 80
    later = [a for a in d.allocations if a.start == NOW + 15 * S]
    assert sum(a.cores for a in later) == 120
    assert d.summary.startswith("80 cores now, 120 more in 15 s")


def test_rejected_names_the_earliest_time_the_request_could_be_met():
    cap = cap_of(gpu(cores=80))
    cap.add("busy:0", "gpu-1", NOW, NOW + 30 * S, 60)
    only_full = CoreRequest("r", 50, 10 * S, accept=frozenset())
    d = decide_one(cap, only_full, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.REJECTED and d.allocations == ()
    assert d.earliest_possible_start == NOW + 30 * S
    # a window closing before then rejects even a request that accepts deferral
    tight = CoreRequest("r", 50, 10 * S, latest_end=NOW + 35 * S)
    d = decide_one(cap, tight, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.REJECTED
    assert d.earliest_possible_start == NOW + 30 * S
    # the same window with room for the deferral is DEFERRED to that instant
    roomy = CoreRequest(
        "r", 50, 10 * S, latest_end=NOW + 40 * S, accept=frozenset({Outcome.DEFERRED})
    )
    d = decide_one(cap, roomy, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.DEFERRED
    assert d.allocations == (Allocation("gpu-1", 50, NOW + 30 * S, NOW + 40 * S),)
    # accepting both, the cores free now are not left idle: PARTIAL is preferred
    both = CoreRequest("r", 50, 10 * S, latest_end=NOW + 40 * S)
    d = decide_one(cap, both, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.PARTIAL
    assert d.allocations == (
        Allocation("gpu-1", 20, NOW, NOW + 10 * S),
        Allocation("gpu-1", 30, NOW + 30 * S, NOW + 40 * S),
    )


def test_partial_needs_the_remainder_inside_the_window_else_deferral_is_tried():
    cap = cap_of(gpu(cores=80))
    cap.add("busy:0", "gpu-1", NOW, NOW + 10 * S, 60)
    cap.add("busy:1", "gpu-1", NOW + 10 * S, NOW + 20 * S, 60)
    # 20 now; the other 30 fit only from 20 s, past this window; all 50 fit from 20 s too
    r = CoreRequest("r", 50, 10 * S, latest_end=NOW + 25 * S)
    d = decide_one(cap, r, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.REJECTED
    assert d.earliest_possible_start == NOW + 20 * S
    r = CoreRequest("r", 50, 10 * S, latest_end=NOW + 30 * S)
    d = decide_one(cap, r, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.PARTIAL
    assert d.allocations == (
        Allocation("gpu-1", 20, NOW, NOW + 10 * S),
        Allocation("gpu-1", 30, NOW + 20 * S, NOW + 30 * S),
    )


def test_a_future_window_is_granted_at_its_earliest_start():
    cap = cap_of(gpu(cores=8))
    r = CoreRequest("r", 8, 5 * S, earliest_start=NOW + 60 * S)
    d = decide_one(cap, r, now=NOW, priority=PRIORITY)
    assert d.outcome is Outcome.GRANTED
    assert d.start == NOW + 60 * S and d.end == NOW + 65 * S
    assert d.summary == "8 cores in 60 s for 5 s (on 1 device)"


def test_all_or_nothing_grants_every_request_or_none():
    cap = cap_of(gpu(cores=10))
    fits = Group((CoreRequest("a", 4, S), CoreRequest("b", 6, S)), all_or_nothing=True)
    ((da, db),) = decide(cap, [fits], now=NOW, priority=PRIORITY)
    assert da.outcome is db.outcome is Outcome.GRANTED
    too_much = Group((CoreRequest("a", 4, S), CoreRequest("b", 7, S)), all_or_nothing=True)
    ((da, db),) = decide(cap, [too_much], now=NOW, priority=PRIORITY)
    assert da.outcome is db.outcome is Outcome.REJECTED
    assert da.allocations == db.allocations == ()
    assert da.earliest_possible_start == db.earliest_possible_start == NOW
    # a rejected group leaves its cores to the next request of the batch
    (_, (dc,)) = decide(
        cap, [too_much, Group((CoreRequest("c", 10, S),))], now=NOW, priority=PRIORITY
    )
    assert dc.outcome is Outcome.GRANTED


# -- placement (CB-7) ------------------------------------------------------------


def test_spread_takes_the_least_loaded_device_and_pack_the_fullest_that_fits():
    cap = cap_of(gpu("a", 16), gpu("b", 16), gpu("c", 16))
    cap.add("x:0", "a", NOW, NOW + 100 * S, 10)
    cap.add("x:1", "b", NOW, NOW + 100 * S, 4)
    spread = decide_one(
        cap, CoreRequest("r", 4, S, placement=Placement.SPREAD), now=NOW, priority=PRIORITY
    )
    assert [a.device_id for a in spread.allocations] == ["c"]
    pack = decide_one(
        cap, CoreRequest("r", 4, S, placement=Placement.PACK), now=NOW, priority=PRIORITY
    )
    assert [a.device_id for a in pack.allocations] == ["a"]
    # too big for any one device: filled most-free first, over the fewest devices
    big = decide_one(
        cap, CoreRequest("r", 20, S, placement=Placement.PACK), now=NOW, priority=PRIORITY
    )
    assert {a.device_id: a.cores for a in big.allocations} == {"c": 16, "b": 4}


def test_spread_balances_a_sequence_of_requests_over_devices():
    cap = cap_of(gpu("a", 8), gpu("b", 8), gpu("c", 8))
    ds = run(cap, *(CoreRequest(f"r{i}", 2, S, placement=Placement.SPREAD) for i in range(6)))
    counts: dict[str, int] = {}
    for d in ds:
        counts[d.allocations[0].device_id] = counts.get(d.allocations[0].device_id, 0) + 1
    assert counts == {"a": 2, "b": 2, "c": 2}


def test_nearest_goes_to_the_closest_device_with_room():
    cap = cap_of(
        gpu("far", 8, x_km=100.0, y_km=0.0),
        gpu("near", 8, x_km=1.0, y_km=1.0),
        gpu("mid", 8, x_km=10.0, y_km=0.0),
    )
    r = CoreRequest("r", 4, S, placement=Placement.NEAREST, location=(0.0, 0.0))
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "near"
    cap.add("x:0", "near", NOW, NOW + 10 * S, 6)
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "mid"


def test_affinity_prefers_devices_that_list_the_task_type():
    cap = cap_of(
        gpu("plain", 8),
        gpu("t-gpu", 8, task_affinities=("computer-vision",)),
    )
    r = CoreRequest("r", 4, S, placement=Placement.AFFINITY, task_type="computer-vision")
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "t-gpu"
    other = CoreRequest("r", 4, S, placement=Placement.AFFINITY, task_type="nlp")
    assert decide_one(cap, other, now=NOW, priority=PRIORITY).granted


def test_lowest_latency_follows_the_operator_table_and_unknown_latency_comes_last():
    cap = cap_of(gpu("a", 8), gpu("b", 8), gpu("c", 8))
    cap.set_latency("edge-1", "a", 9.0)
    cap.set_latency("edge-1", "b", 2.5)
    r = CoreRequest("r", 12, S, placement=Placement.LOWEST_LATENCY, site="edge-1")
    d = decide_one(cap, r, now=NOW, priority=PRIORITY)
    assert {a.device_id: a.cores for a in d.allocations} == {"b": 8, "a": 4}
    cap.set_latency("edge-1", "b", None)
    r = CoreRequest("r", 4, S, placement=Placement.LOWEST_LATENCY, site="edge-1")
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "a"


def test_the_broker_default_placement_applies_when_the_request_names_none():
    cap = cap_of(gpu("a", 16), gpu("b", 16))
    cap.add("x:0", "a", NOW, NOW + 100 * S, 10)
    r = CoreRequest("r", 4, S)
    assert run(cap, r, default_placement=Placement.PACK)[0].allocations[0].device_id == "a"
    assert run(cap, r, default_placement=Placement.SPREAD)[0].allocations[0].device_id == "b"


def test_device_kind_and_device_ids_restrict_the_candidates():
    cap = cap_of(gpu("g", 8), Device("t", "TPU", 8))
    r = CoreRequest("r", 4, S, device_kind="TPU")
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "t"
    r = CoreRequest("r", 4, S, device_ids=("g",))
    assert decide_one(cap, r, now=NOW, priority=PRIORITY).allocations[0].device_id == "g"


# -- priority (CB-3) --------------------------------------------------------------


def test_priority_reports_a_level_and_a_score_from_configurable_weights():
    p = PRIORITY(high("h", 1, 1))
    assert p.level == "HIGH" and 2 / 3 <= p.score <= 1
    p = PRIORITY(low("l", 1, 1))
    assert p.level == "LOW" and 0 <= p.score < 1 / 3
    training_first = PriorityFunction(
        mix={"task": 1.0}, task_types={"training": 1.0, "computer-vision": 0.1}
    )
    assert training_first(low("l", 1, 1)).score == 1.0
    assert training_first(high("h", 1, 1)).score == pytest.approx(0.1)
    assert parse_weights("vision=1, training=0.2,*=0.5") == {
        "vision": 1.0,
        "training": 0.2,
        "*": 0.5,
    }
    with pytest.raises(ValueError, match=r"0\.\.1"):
        parse_weights("a=2")
    with pytest.raises(ValueError, match="unknown"):
        PriorityFunction(qos_levels={"GOLD": 1.0})


# -- validation (X-3) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (CoreRequest("r", 0, S), "cores"),
        (CoreRequest("r", -3, S), "cores"),
        (CoreRequest("r", 1, 0), "duration"),
        (CoreRequest("r", 1, -S), "duration"),
        (CoreRequest("r", 1, 10 * S, latest_end=NOW + 5 * S), "window"),
        (CoreRequest("r", 1, S, device_kind="QPU"), "device_kind"),
        (CoreRequest("r", 100, S), "cores"),
        (CoreRequest("r", 9, S, device_kind="TPU"), "cores"),
        (CoreRequest("r", 1, S, priority_hint=101), "priority_hint"),
        (CoreRequest("r", 1, S, placement=Placement.NEAREST), "client_location"),
        (CoreRequest("r", 1, S, placement=Placement.LOWEST_LATENCY), "client_location.site"),
        (CoreRequest("r", 1, S, placement=Placement.AFFINITY), "task_type"),
    ],
)
def test_bad_requests_name_the_field_and_the_rule(request_, field):
    cap = cap_of(gpu("g", 16), Device("t", "TPU", 8))
    with pytest.raises(InvalidArgument) as err:
        validate_request(cap, request_, now=NOW, max_duration_ms=3600 * S)
    assert err.value.violations[0].field == field


def test_an_unknown_device_id_is_not_found():
    cap = cap_of(gpu("g", 16))
    with pytest.raises(NotFound):
        validate_request(
            cap, CoreRequest("r", 1, S, device_ids=("nope",)), now=NOW, max_duration_ms=S
        )


def test_the_map_counts_reservations_not_their_parts():
    cap = CapacityMap()
    cap.upsert_device(Device("d0", "GPU", 8))
    cap.upsert_device(Device("d1", "GPU", 8))
    cap.add("r1:0:20:4", "d0", 0, 20, 4)
    cap.add("r1:1:30:4", "d1", 10, 30, 4)  # a second part of r1
    cap.add("r2:0:20:2", "d1", 0, 20, 2)
    cap.add("r2:0:20:2", "d1", 0, 20, 2)  # the same row again: not added
    assert cap.reservations() == 2
    cap.remove("r1:0:20:4")
    assert cap.reservations() == 2  # r1 still holds its second part
    cap.remove("r1:1:30:4")
    cap.remove("r1:1:30:4")  # gone already: no change
    assert cap.reservations() == 1
    cap.assume([Allocation("d0", 1, 0, 5)])  # assumed: no reservation of its own
    assert cap.reservations() == 1
