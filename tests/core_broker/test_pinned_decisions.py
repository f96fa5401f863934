"""The broker's priority function and request checks (CB-3, CB-5, X-3) at their
bounds: found untested by bench/mutation.py (issue 17). Pure."""

from __future__ import annotations

import pytest

from lightpath.errors import InvalidArgument, NotFound
from lightpath_services.core_broker.capacity import CapacityMap, Device
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Placement,
    Priority,
    PriorityFunction,
    default_billing_weights,
    default_mix,
    default_qos_weights,
    default_task_weights,
    parse_weights,
    validate_request,
)

NOW = 1_700_000_000_000


def test_parse_weights_bounds_and_form():
    assert parse_weights(" a=0 , b=1,,*=0.5 ") == {"a": 0.0, "b": 1.0, "*": 0.5}
    assert parse_weights("") == {}
    for bad in ("a", "=0.5", "a=1.01", "a=-0.01", " =1"):
        with pytest.raises(ValueError):
            parse_weights(bad)


def test_the_default_tables():
    assert default_mix() == {"hint": 0.4, "task": 0.2, "qos": 0.25, "billing": 0.15}
    assert default_qos_weights() == {"PREMIUM": 1.0, "STANDARD": 0.6, "BEST_EFFORT": 0.2}
    assert default_billing_weights() == {"COMMITTED": 1.0, "ON_DEMAND": 0.6, "SPOT": 0.1}
    t = default_task_weights()
    assert t["computer-vision"] == 1.0 and t["training"] == 0.2 and t["*"] == 0.5
    assert t == {
        "computer-vision": 1.0,
        "video-analytics": 0.9,
        "nlp": 0.7,
        "inference": 0.6,
        "graphics": 0.5,
        "training": 0.2,
        "*": 0.5,
    }


def test_priority_is_the_weighted_mean_with_levels_at_thirds():
    f = PriorityFunction()
    r = CoreRequest("r", 1, 1000, task_type="nlp", priority_hint=50)
    # 0.4·0.5 + 0.2·0.7 + 0.25·0.6 + 0.15·0.6 = 0.58
    assert f(r) == Priority("MEDIUM", 0.58)
    unknown = CoreRequest("r", 1, 1000, task_type="??", priority_hint=0, qos_level="X")
    assert f(unknown) == Priority("LOW", round((0.2 * 0.5 + 0.15 * 0.6) / 1.0, 6))
    only_hint = PriorityFunction(mix={"hint": 2.0})
    assert only_hint(CoreRequest("r", 1, 1000, priority_hint=100)) == Priority("HIGH", 1.0)
    assert only_hint(CoreRequest("r", 1, 1000, priority_hint=0)) == Priority("LOW", 0.0)
    # the level boundaries: exactly 1/3 is MEDIUM, exactly 2/3 HIGH
    thirds = PriorityFunction(mix={"task": 1.0}, task_types={"a": 1 / 3, "b": 2 / 3, "c": 0.3})
    assert thirds(CoreRequest("r", 1, 1000, task_type="a")).level == "MEDIUM"
    assert thirds(CoreRequest("r", 1, 1000, task_type="b")).level == "HIGH"
    assert thirds(CoreRequest("r", 1, 1000, task_type="c")).level == "LOW"
    # no "*": an unknown task type weighs 0.5
    assert thirds(CoreRequest("r", 1, 1000, task_type="zz")).score == 0.5
    assert thirds(CoreRequest("r", 1, 1000, task_type="a")).score == round(1 / 3, 6)


def test_priority_function_refuses_bad_tables():
    with pytest.raises(ValueError):
        PriorityFunction(mix={"hint": 1.0, "color": 1.0})
    with pytest.raises(ValueError):
        PriorityFunction(mix={"hint": 0.0})
    with pytest.raises(ValueError):
        PriorityFunction(qos_levels={"GOLD": 1.0})
    with pytest.raises(ValueError):
        PriorityFunction(billing_models={"FREE": 1.0})
    PriorityFunction(mix={"hint": 0.0, "qos": 0.1})  # a positive sum is enough


def cap() -> CapacityMap:
    c = CapacityMap()
    c.upsert_device(Device("gpu-1", "GPU", 80))
    c.upsert_device(Device("gpu-2", "GPU", 40))
    return c


def violations(r: CoreRequest, max_ms: int = 3_600_000) -> list[str]:
    try:
        validate_request(cap(), r, now=NOW, max_duration_ms=max_ms)
    except InvalidArgument as e:
        return [v.field for v in e.violations]
    return []


def test_request_bounds():
    ok = CoreRequest("r", 1, 1000)
    assert violations(ok) == []
    assert violations(CoreRequest("r", 0, 1000)) == ["cores"]
    assert violations(CoreRequest("r", 1, 0)) == ["duration"]
    assert violations(CoreRequest("r", 1, 3_600_000)) == []
    assert violations(CoreRequest("r", 1, 3_600_001)) == ["duration"]
    assert violations(CoreRequest("r", 1, 1000, priority_hint=100)) == []
    assert violations(CoreRequest("r", 1, 1000, priority_hint=0)) == []
    assert violations(CoreRequest("r", 1, 1000, priority_hint=101)) == ["priority_hint"]
    assert violations(CoreRequest("r", 1, 1000, priority_hint=-1)) == ["priority_hint"]
    assert violations(CoreRequest("r", 1, 1000, device_kind="QPU")) == ["device_kind"]


def test_the_window_must_hold_the_duration():
    assert violations(CoreRequest("r", 1, 1000, latest_end=NOW + 1000)) == []
    assert violations(CoreRequest("r", 1, 1000, latest_end=NOW + 999)) == ["window"]
    start = NOW + 5000
    assert (
        violations(CoreRequest("r", 1, 1000, earliest_start=start, latest_end=start + 1000)) == []
    )
    assert violations(CoreRequest("r", 1, 1000, earliest_start=start, latest_end=start + 999)) == [
        "window"
    ]
    # an earliest start in the past counts from now
    assert violations(
        CoreRequest("r", 1, 1000, earliest_start=NOW - 5000, latest_end=NOW + 999)
    ) == ["window"]


def test_placement_policies_name_what_they_need():
    assert violations(CoreRequest("r", 1, 1000, placement=Placement.NEAREST)) == ["client_location"]
    assert (
        violations(CoreRequest("r", 1, 1000, placement=Placement.NEAREST, location=(0.0, 0.0)))
        == []
    )
    assert violations(CoreRequest("r", 1, 1000, placement=Placement.LOWEST_LATENCY)) == [
        "client_location.site"
    ]
    assert violations(CoreRequest("r", 1, 1000, placement=Placement.AFFINITY)) == ["task_type"]


def test_cores_at_most_what_the_eligible_devices_have():
    assert violations(CoreRequest("r", 120, 1000)) == []
    assert violations(CoreRequest("r", 121, 1000)) == ["cores"]
    assert violations(CoreRequest("r", 40, 1000, device_ids=("gpu-2",))) == []
    with pytest.raises(InvalidArgument) as e:
        validate_request(
            cap(), CoreRequest("r", 41, 1000, device_ids=("gpu-2",)), now=NOW, max_duration_ms=10**7
        )
    assert "at most 40, the cores of the named devices" in e.value.violations[0].rule
    with pytest.raises(InvalidArgument) as e:
        validate_request(
            cap(), CoreRequest("r", 121, 1000, device_kind="GPU"), now=NOW, max_duration_ms=10**7
        )
    assert "at most 120, the cores of every GPU device" in e.value.violations[0].rule
    with pytest.raises(NotFound):
        validate_request(
            cap(), CoreRequest("r", 1, 1000, device_ids=("nope",)), now=NOW, max_duration_ms=10**7
        )


def test_an_earliest_start_at_most_half_the_time_span_ahead():
    from lightpath_services.core_broker.capacity import MAX_SPAN_MS

    half = MAX_SPAN_MS // 2
    assert violations(CoreRequest("r", 1, 1000, earliest_start=NOW + half)) == []
    assert violations(CoreRequest("r", 1, 1000, earliest_start=NOW + half + 1)) == [
        "window.earliest_start"
    ]


def test_request_defaults_and_the_score_is_clamped():
    r = CoreRequest("r", 1, 1000)
    assert (r.priority_hint, r.qos_level, r.billing_model, r.placement) == (
        50,
        "STANDARD",
        "ON_DEMAND",
        None,
    )
    only_hint = PriorityFunction(mix={"hint": 1.0})
    assert only_hint(CoreRequest("r", 1, 1000, priority_hint=250)) == Priority("HIGH", 1.0)
    assert only_hint(CoreRequest("r", 1, 1000, priority_hint=-50)) == Priority("LOW", 0.0)


S = 1000


def one_gpu(cores: int = 10) -> CapacityMap:
    c = CapacityMap()
    c.upsert_device(Device("gpu-1", "GPU", cores))
    return c


def test_a_group_is_not_all_or_nothing_unless_asked():
    from lightpath_services.core_broker.decisions import Group, Outcome, decide

    g = Group((CoreRequest("a", 6, S), CoreRequest("b", 6, S)))
    assert g.all_or_nothing is False
    ((da, db),) = decide(one_gpu(), [g], now=NOW, priority=PriorityFunction())
    assert da.outcome is Outcome.GRANTED and db.outcome is not Outcome.GRANTED


def test_a_one_request_all_or_nothing_group_may_take_a_lesser_outcome():
    from lightpath_services.core_broker.decisions import Group, Outcome, decide

    busy = CoreRequest("busy", 10, 5 * S)
    g = Group((CoreRequest("a", 6, S),), all_or_nothing=True)
    (_, (d,)) = decide(one_gpu(), [Group((busy,)), g], now=NOW, priority=PriorityFunction())
    assert d.outcome is Outcome.DEFERRED and d.start == NOW + 5 * S


def test_higher_priority_first_whatever_the_order_given_and_ties_in_order():
    from lightpath_services.core_broker.decisions import Group, Outcome, decide

    f = PriorityFunction()
    lo = CoreRequest("lo", 6, S, priority_hint=10)
    hi = CoreRequest("hi", 6, S, priority_hint=90)
    ((dl,), (dh,)) = decide(one_gpu(), [Group((lo,)), Group((hi,))], now=NOW, priority=f)
    assert dh.outcome is Outcome.GRANTED and dl.outcome is not Outcome.GRANTED
    first, second = CoreRequest("first", 6, S), CoreRequest("second", 6, S)
    ((d1,), (d2,)) = decide(one_gpu(), [Group((first,)), Group((second,))], now=NOW, priority=f)
    assert d1.outcome is Outcome.GRANTED and d2.outcome is not Outcome.GRANTED


def test_all_or_nothing_says_which_member_failed():
    from lightpath_services.core_broker.decisions import Group, Outcome, decide

    g = Group(
        (CoreRequest("a", 4, S, priority_hint=90), CoreRequest("b", 7, S, priority_hint=10)),
        all_or_nothing=True,
    )
    ((da, db),) = decide(one_gpu(), [g], now=NOW, priority=PriorityFunction())
    assert da.outcome is db.outcome is Outcome.REJECTED
    assert da.summary == "all or nothing: b cannot be granted now"
    assert not db.summary.startswith("all or nothing: b")
    assert db.summary.startswith("all or nothing: ")
