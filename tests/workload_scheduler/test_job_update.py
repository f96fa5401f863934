"""The pure rules of UpdateJob (lightpath.domain.job_update): masks, values, what changed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath.domain.job_update import LABEL_KEY, parse_update
from lightpath.errors import InvalidArgument
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import workload_scheduler_pb2 as ws


def _spec(**kw) -> ws.JobSpec:
    return ws.JobSpec(job_id="j", **kw)


def _fields(err: InvalidArgument) -> dict[str, str]:
    return {v.field: v.rule for v in err.violations}


def test_priority_replaces_a_class_and_the_class_replaces_a_priority():
    current = _spec(priority_class=c.PRIORITY_CLASS_HIGH)
    upd = parse_update(_spec(priority=30), ["priority"]).apply(current)
    assert (upd.spec.priority, upd.spec.priority_class, upd.priority) == (30, 0, 30)
    assert upd.changes == ("priority 80 → 30",)
    back = parse_update(_spec(priority_class=c.PRIORITY_CLASS_LOW), ["priority_class"])
    upd = back.apply(upd.spec)
    assert (upd.spec.priority, upd.spec.priority_class, upd.priority) == (
        0,
        c.PRIORITY_CLASS_LOW,
        20,
    )
    # both at once: refused, not one of them taken and the other dropped (issue 33)
    with pytest.raises(InvalidArgument) as info:
        parse_update(
            _spec(priority=70, priority_class=c.PRIORITY_CLASS_HIGH),
            ["priority", "priority_class"],
        )
    assert "conflict" in _fields(info.value)["update_mask.paths[1]"]


def test_labels_one_by_one_or_the_whole_map():
    current = _spec(labels={"team": "ml", "env": "dev", "tenant": "acme"})
    one = parse_update(_spec(labels={"env": "prod"}), ["labels.env", "labels.gone"])
    upd = one.apply(current)
    assert dict(upd.spec.labels) == {"team": "ml", "env": "prod", "tenant": "acme"}
    assert upd.changes == ("labels set env=prod",)
    drop = parse_update(_spec(), ["labels.team"]).apply(current)
    assert dict(drop.spec.labels) == {"env": "dev", "tenant": "acme"}
    assert drop.changes == ("labels removed team",)
    # the whole map; a reserved label (the cell's tenant) is kept
    whole = parse_update(_spec(labels={"a": "1"}), ["labels"], reserved=["tenant"])
    upd = whole.apply(current)
    assert dict(upd.spec.labels) == {"a": "1", "tenant": "acme"}
    assert upd.changes == ("labels set a=1", "labels removed env, team")
    # nothing to change: no change said
    same = parse_update(_spec(labels={"team": "ml"}), ["labels.team"]).apply(current)
    assert same.changes == () and same.describe() == "unchanged"
    assert current.labels["team"] == "ml"  # the current spec itself is left alone


@pytest.mark.parametrize(
    ("patch", "paths", "field", "words"),
    [
        (_spec(), [], "update_mask.paths", "is required"),
        (_spec(), ["shape"], "update_mask.paths[0]", "'shape' cannot be updated"),
        (_spec(), ["*"], "update_mask.paths[0]", "'*' is not accepted"),
        (_spec(priority=50), ["priority", "spec.wrap"], "update_mask.paths[1]", "updatable:"),
        (_spec(priority=0), ["priority"], "spec.priority", "must be 1..100"),
        (_spec(priority=101), ["priority"], "spec.priority", "must be 1..100"),
        (_spec(priority_class=7), ["priority_class"], "spec.priority_class", "LOW, MEDIUM"),
        (_spec(), ["labels.-x"], "update_mask.paths[0]", "label key"),
        (_spec(), ["labels.tenant"], "update_mask.paths[0]", "kept by the cell"),
        (_spec(), ["labels", "labels.a"], "update_mask.paths[1]", "overlaps 'labels'"),
        (_spec(labels={"a b": "1"}), ["labels"], "spec.labels[a b]", "label key"),
        (_spec(labels={"a": "x" * 257}), ["labels.a"], "spec.labels[a]", "at most 256"),
        (
            _spec(labels={f"k{i}": "v" for i in range(65)}),
            ["labels"],
            "spec.labels",
            "at most 64 labels",
        ),
    ],
)
def test_bad_masks_and_values_name_the_path_or_field(patch, paths, field, words):
    with pytest.raises(InvalidArgument) as info:
        parse_update(patch, paths, reserved=["tenant"])
    rules = _fields(info.value)
    assert field in rules and words in rules[field], rules


def test_a_repeated_path_is_refused():
    """Issue 33: a path named twice is a mistake to report, not a change to merge."""
    with pytest.raises(InvalidArgument) as info:
        parse_update(_spec(priority=60), ["priority", "priority"])
    assert "named twice" in _fields(info.value)["update_mask.paths[1]"]


def test_the_tenant_label_is_kept_by_a_whole_map_update_and_never_changed():
    current = _spec(labels={"team": "ml", "tenant": "acme"})
    plan = parse_update(_spec(labels={"a": "1"}), ["labels"], reserved=["tenant"])
    assert dict(plan.apply(current).spec.labels) == {"a": "1", "tenant": "acme"}
    same = parse_update(_spec(labels={"a": "1", "tenant": "acme"}), ["labels"], reserved=["tenant"])
    assert dict(same.apply(current).spec.labels) == {"a": "1", "tenant": "acme"}
    other = parse_update(_spec(labels={"tenant": "beta"}), ["labels"], reserved=["tenant"])
    with pytest.raises(InvalidArgument) as info:
        other.apply(current)
    assert "cannot change" in _fields(info.value)["spec.labels[tenant]"]
    # a job without a tenant does not get one by an update
    with pytest.raises(InvalidArgument):
        other.apply(_spec(labels={"team": "ml"}))


_keys = st.from_regex(LABEL_KEY, fullmatch=True)
_maps = st.dictionaries(_keys, st.text(max_size=8), max_size=6)


@given(_maps, _maps, st.sets(_keys, min_size=1, max_size=6))
def test_per_key_updates_touch_only_the_keys_named(current, given_labels, keys):
    """Every label not named keeps its value; each named one ends as given (or gone)."""
    plan = parse_update(_spec(labels=given_labels), [f"labels.{k}" for k in sorted(keys)])
    upd = plan.apply(_spec(labels=current))
    after = dict(upd.spec.labels)
    for k, v in current.items():
        if k not in keys:
            assert after[k] == v
    for k in keys:
        assert after.get(k) == given_labels.get(k)
    assert bool(upd.changes) == (after != current)
