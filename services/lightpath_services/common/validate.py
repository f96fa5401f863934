"""Checks of the well-known time types at the edge (X-3).

A `google.protobuf.Timestamp` or `Duration` is two integers a client may set to
anything; protobuf's own conversions raise a bare ValueError (INTERNAL) or
silently normalise what they are given. Every servicer reads such a field
through these functions, which refuse a bad one with INVALID_ARGUMENT naming
the field path (`requests[3].window.earliest_start`) and the rule:

* Timestamp: nanos in 0..999,999,999 (as the proto defines it), seconds between
  1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z unless the caller says otherwise.
* Duration: nanos within ±999,999,999, seconds and nanos of the same sign,
  seconds within ±315,576,000,000 (about 10,000 years, the proto's own range),
  and the caller's `min_s`/`max_s`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.errors import InvalidArgument

MAX_NANOS = 999_999_999
MIN_TIMESTAMP_S = 0  # 1970-01-01T00:00:00Z
MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z
MAX_DURATION_S = 315_576_000_000  # the Duration proto's own bound, about 10,000 years
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def present(msg: Message, name: str) -> Any:
    """`msg.<name>` if the field is set, else None (for `timestamp`/`duration`)."""
    return getattr(msg, name) if msg.HasField(name) else None


def _iso(seconds: int) -> str:
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(
    ts: Timestamp | None,
    field: str,
    *,
    required: bool = False,
    min_s: int = MIN_TIMESTAMP_S,
    max_s: int = MAX_TIMESTAMP_S,
) -> datetime | None:
    """`ts` as an aware UTC datetime; None when unset (`ts` None) and not `required`."""
    if ts is None:
        if required:
            raise InvalidArgument(field, "is required")
        return None
    if not 0 <= ts.nanos <= MAX_NANOS:
        raise InvalidArgument(field, f"nanos must lie in 0..999,999,999 (got {ts.nanos})")
    if not min_s <= ts.seconds <= max_s:
        raise InvalidArgument(
            field, f"must lie between {_iso(min_s)} and {_iso(max_s)} (seconds {ts.seconds})"
        )
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def timestamp_ms(
    ts: Timestamp | None,
    field: str,
    *,
    required: bool = False,
    min_s: int = MIN_TIMESTAMP_S,
    max_s: int = MAX_TIMESTAMP_S,
) -> int | None:
    """`ts` in milliseconds since the epoch (checked as `timestamp` checks it)."""
    if timestamp(ts, field, required=required, min_s=min_s, max_s=max_s) is None:
        return None
    assert ts is not None
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def duration(
    d: Duration | None,
    field: str,
    *,
    min_s: float | None = None,
    max_s: float | None = None,
    required: bool = False,
) -> float | None:
    """`d` in seconds; None when unset (`d` None) and not `required`."""
    if d is None:
        if required:
            raise InvalidArgument(field, "is required")
        return None
    if not -MAX_NANOS <= d.nanos <= MAX_NANOS:
        raise InvalidArgument(field, f"nanos must lie within ±999,999,999 (got {d.nanos})")
    if (d.seconds > 0 and d.nanos < 0) or (d.seconds < 0 and d.nanos > 0):
        raise InvalidArgument(field, "seconds and nanos must have the same sign")
    if not -MAX_DURATION_S <= d.seconds <= MAX_DURATION_S:
        raise InvalidArgument(field, "seconds must lie within ±315,576,000,000 (10,000 years)")
    seconds = d.seconds + d.nanos / 1e9
    if min_s is not None and seconds < min_s:
        raise InvalidArgument(field, f"must be at least {min_s:g} s")
    if max_s is not None and seconds > max_s:
        raise InvalidArgument(field, f"must be at most {max_s:g} s")
    return seconds


def duration_ms(
    d: Duration | None,
    field: str,
    *,
    min_s: float | None = None,
    max_s: float | None = None,
    required: bool = False,
) -> int | None:
    """`d` in whole milliseconds (checked as `duration` checks it)."""
    if duration(d, field, min_s=min_s, max_s=max_s, required=required) is None:
        return None
    assert d is not None
    return d.seconds * 1000 + int(d.nanos / 1_000_000)
