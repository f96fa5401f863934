"""The audit log's counts of shed calls (issue 30): a call shed at the door is counted,
one line per method and caller, written a second after the first of them or at close;
every other call it writes is a line of its own."""

from __future__ import annotations

import asyncio
import json

from lightpath_services.common import audit as audit_module
from lightpath_services.common.audit import AuditLog

SUBMIT = "/lightpath.v1.CellScheduler/SubmitJob"


def _entries(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_shed_calls_are_counted_per_method_and_caller_and_written_once_due(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(audit_module, "SHED_EVERY_S", 0.05)
    path = tmp_path / "audit.jsonl"
    log = AuditLog("cell_scheduler", "cell-1", str(path))
    for _ in range(3):
        log.shed(method=SUBMIT, principal="tenant:acme")
    log.shed(method=SUBMIT, principal="tenant:beta")
    log.record(
        method=SUBMIT, principal="tenant:acme", code="PERMISSION_DENIED", request=None, trace_id=""
    )
    assert [e["code"] for e in _entries(path)] == ["PERMISSION_DENIED"]  # the counts wait
    for _ in range(100):
        if len(_entries(path)) == 3:
            break
        await asyncio.sleep(0.02)
    counted = {e["principal"]: e for e in _entries(path)[1:]}
    assert {p: e["count"] for p, e in counted.items()} == {"tenant:acme": 3, "tenant:beta": 1}
    for e in counted.values():
        assert (e["code"], e["reason"], e["method"]) == ("RESOURCE_EXHAUSTED", "OVERLOADED", SUBMIT)
        assert e["service"] == "cell_scheduler" and e["instance"] == "cell-1"
    # counting starts again after a write; what is left is written at close
    log.shed(method=SUBMIT, principal="tenant:acme")
    log.close()
    last = _entries(path)[-1]
    assert (last["principal"], last["count"]) == ("tenant:acme", 1)
    assert len(_entries(path)) == 4


def test_without_an_event_loop_a_shed_call_is_written_at_once(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog("cell_scheduler", "cell-1", str(path))
    log.shed(method=SUBMIT, principal="operator:operator")
    assert [(e["count"], e["code"]) for e in _entries(path)] == [(1, "RESOURCE_EXHAUSTED")]
    log.close()
    assert len(_entries(path)) == 1


def test_a_disabled_audit_log_counts_nothing(tmp_path):
    log = AuditLog("cell_scheduler", "cell-1", "")
    log.shed(method=SUBMIT, principal="tenant:acme")
    log.close()
    assert list(tmp_path.iterdir()) == []
