"""Timestamps, Durations and page tokens checked at the edge (X-3, issue 14): a
bad one is INVALID_ARGUMENT naming the field and the rule, never a bare
ValueError (INTERNAL) and never silently normalised."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from lightpath.errors import InvalidArgument
from lightpath.v1 import core_broker_pb2
from lightpath_services.common import paging, validate
from lightpath_services.common.keys import is_valid_id


def violation(err: pytest.ExceptionInfo[InvalidArgument]) -> tuple[str, str]:
    (v,) = err.value.violations
    return v.field, v.rule


def test_timestamp_in_range_is_a_datetime():
    ts = Timestamp(seconds=1_700_000_000, nanos=250_000_000)
    assert validate.timestamp(ts, "start") == datetime(2023, 11, 14, 22, 13, 20, 250_000, UTC)
    assert validate.timestamp_ms(ts, "start") == 1_700_000_000_250
    assert validate.timestamp(Timestamp(seconds=253_402_300_799), "start").year == 9999


def test_unset_timestamp_is_none_unless_required():
    assert validate.timestamp(None, "start") is None
    assert validate.timestamp_ms(None, "start") is None
    with pytest.raises(InvalidArgument) as err:
        validate.timestamp(None, "requests[3].window.latest_end", required=True)
    assert violation(err) == ("requests[3].window.latest_end", "is required")


@pytest.mark.parametrize(
    ("seconds", "nanos", "rule"),
    [
        (-(2**63), 0, "must lie between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
        (2**63 - 1, 0, "must lie between"),
        (253_402_300_800, 0, "must lie between"),
        (-1, 0, "must lie between"),
        (0, -1, "nanos must lie in 0..999,999,999"),
        (0, 1_000_000_000, "nanos must lie in 0..999,999,999"),
        (1_700_000_000, -(2**31), "nanos must lie in 0..999,999,999"),
    ],
)
def test_bad_timestamp_names_the_field_and_rule(seconds, nanos, rule):
    with pytest.raises(InvalidArgument) as err:
        validate.timestamp(Timestamp(seconds=seconds, nanos=nanos), "requests[3].window.start")
    field, said = violation(err)
    assert field == "requests[3].window.start"
    assert said.startswith(rule)


def test_timestamp_bounds_are_the_callers():
    ts = Timestamp(seconds=100)
    with pytest.raises(InvalidArgument) as err:
        validate.timestamp(ts, "at", min_s=200, max_s=300)
    assert violation(err)[1].startswith("must lie between 1970-01-01T00:03:20Z")


def test_duration_in_seconds():
    assert validate.duration(Duration(seconds=1, nanos=500_000_000), "deadline") == 1.5
    assert validate.duration(Duration(seconds=-1, nanos=-500_000_000), "d") == -1.5
    assert validate.duration_ms(Duration(seconds=-1, nanos=-500_000_000), "d") == -1500
    assert validate.duration_ms(Duration(nanos=-1_999_999), "d") == -1
    assert validate.duration(None, "deadline") is None
    with pytest.raises(InvalidArgument) as err:
        validate.duration(None, "deadline", required=True)
    assert violation(err) == ("deadline", "is required")


@pytest.mark.parametrize(
    ("seconds", "nanos", "rule"),
    [
        (0, 1_000_000_000, "nanos must lie within ±999,999,999"),
        (0, -1_000_000_000, "nanos must lie within ±999,999,999"),
        (5, 2**31 - 1, "nanos must lie within ±999,999,999"),
        (1, -1, "seconds and nanos must have the same sign"),
        (-1, 1, "seconds and nanos must have the same sign"),
        (2**63 - 1, 0, "seconds must lie within ±315,576,000,000"),
        (-(2**63), 0, "seconds must lie within ±315,576,000,000"),
    ],
)
def test_bad_duration_is_refused_not_normalised(seconds, nanos, rule):
    with pytest.raises(InvalidArgument) as err:
        validate.duration(Duration(seconds=seconds, nanos=nanos), "request.duration")
    field, said = violation(err)
    assert field == "request.duration"
    assert said.startswith(rule)


def test_duration_bounds_are_the_callers():
    with pytest.raises(InvalidArgument) as err:
        validate.duration(Duration(seconds=-1), "deadline", min_s=0)
    assert violation(err) == ("deadline", "must be at least 0 s")
    with pytest.raises(InvalidArgument) as err:
        validate.duration(Duration(seconds=61), "deadline", max_s=60)
    assert violation(err) == ("deadline", "must be at most 60 s")


def test_present_reads_only_set_fields():
    m = core_broker_pb2.QueryCapacityRequest()
    assert validate.present(m, "start") is None
    m.start.seconds = 5
    assert validate.present(m, "start") == Timestamp(seconds=5)


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
def test_any_timestamp_is_a_datetime_or_invalid_argument(seconds, nanos):
    try:
        at = validate.timestamp(Timestamp(seconds=seconds, nanos=nanos), "at")
    except InvalidArgument as err:
        assert err.violations[0].field == "at"
    else:
        assert at is not None and 1970 <= at.year <= 9999


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
def test_any_duration_is_seconds_or_invalid_argument(seconds, nanos):
    try:
        ms = validate.duration_ms(Duration(seconds=seconds, nanos=nanos), "d")
    except InvalidArgument as err:
        assert err.violations[0].field == "d"
    else:
        assert ms is not None and abs(ms) <= 315_576_000_000_999


def _token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize("text", ["²", "١٢", "-1", "1.5", " 1", "1\n", "9" * 19, "9" * 5000, "x"])
def test_page_token_that_is_not_a_position_is_refused(text):
    with pytest.raises(InvalidArgument) as err:
        paging.token_int(_token(text))
    assert violation(err) == ("page_token", "is not a token this service returned")


def test_page_token_round_trip_and_maximum():
    assert paging.token_int("") is None
    assert paging.token_int(paging.page_token(42)) == 42
    with pytest.raises(InvalidArgument):
        paging.token_int(paging.page_token(42), maximum=41)
    assert paging.token_id(paging.page_token("job-7")) == "job-7"
    for bad in ("%%%", _token("job-7\n"), base64.b64encode(b"\xff\xfe").decode()):
        with pytest.raises(InvalidArgument):
            paging.token_id(bad)


def test_an_id_ends_at_its_last_character():
    assert is_valid_id("pod-1")
    assert not is_valid_id("pod-1\n")
