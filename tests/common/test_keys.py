from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath_services.common.keys import (
    cell_key,
    hash_tag,
    is_valid_id,
    pod_key,
    tenant_key,
    validate_id,
)

ids = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)


def test_pod_keys_carry_the_pod_as_hash_tag():
    assert pod_key("pod-1", "block", 7) == "lp:{pod-1}:block:7"
    assert tenant_key("acme", "app", "a1") == "lp:{t:acme}:app:a1"
    assert cell_key("pods") == "lp:{cell}:pods"


@given(pod=ids, part=ids)
def test_every_key_of_a_pod_hashes_to_the_same_tag(pod, part):
    assert hash_tag(pod_key(pod, part)) == pod
    assert hash_tag(pod_key(pod, "job", part, "events")) == pod


@pytest.mark.parametrize("bad", ["", "a:b", "a{b}", "x" * 65, "sp ace", "é"])
def test_invalid_ids_are_refused_with_the_rule(bad):
    assert not is_valid_id(bad)
    with pytest.raises(ValueError, match="must be 1-64 characters"):
        validate_id(bad, "job_id")
    with pytest.raises(ValueError):
        pod_key(bad, "x")


def test_key_parts_may_not_smuggle_braces():
    with pytest.raises(ValueError, match="braces"):
        pod_key("pod-1", "{pod-2}")
