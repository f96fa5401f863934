"""The history checker (lightpath.testing.history) finds what a run lost or contradicted."""

from __future__ import annotations

import pytest

from lightpath.testing.history import Final, History


def test_a_clean_history_checks_out():
    h = History()
    h.ack("submit", "a", 1.0, "RUNNING")
    h.ack("complete", "a", 2.0)
    h.ack("submit", "b", 3.0, "PENDING")
    h.ack("reserve", "r1", 1.5)
    h.ack("release", "r1", 2.5)
    h.indeterminate("submit", "c", 4.0)  # timed out: absent is fine
    final = Final(
        jobs={"a": ("COMPLETED", ()), "b": ("RUNNING", (1, 2))},
        slices={"b": (1, 2)},
        reservations={"r1": "RELEASED"},
    )
    report = h.check(final)
    assert report.ok, report.details()
    assert report.acknowledged == 3


def test_lost_contradicted_undefined_and_double_booked_are_each_found():
    h = History()
    h.ack("submit", "lost", 1.0)
    h.ack("cancel", "undone", 1.0)
    h.ack("reserve", "r", 1.0)
    final = Final(
        jobs={
            "undone": ("RUNNING", (3,)),
            "x": ("RUNNING", (3, 4)),
            "limbo": ("UNKNOWN", ()),
        },
        slices={"x": (3, 4), "gone": (5,), "undone": (3,)},
    )
    r = h.check(final)
    assert [s.split(":")[0] for s in r.lost] == ["lost", "r"]
    assert r.contradicted == ["undone: cancel acknowledged, final state RUNNING (not CANCELLED)"]
    assert r.undefined == ["limbo: UNKNOWN, not a definite state"]
    assert "block 3 in jobs undone and x" in r.double_booked
    assert "block 3 in slices undone and x" in r.double_booked
    assert "slice gone on blocks [5] wired, its job absent" in r.double_booked
    assert not r.ok


def test_an_unknown_operation_is_refused():
    with pytest.raises(ValueError, match="no operation 'wire'"):
        History().ack("wire", "a", 0.0)
