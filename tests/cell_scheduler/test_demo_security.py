"""The security demo step against real services over mTLS: each refusal it shows is
the service's own answer, and the audit log it prints is the cell's."""

from __future__ import annotations

from lightpath.demo import DemoContext
from lightpath.demo import security as demo
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2
from tests.cell_scheduler.conftest import cell_stack
from tests.helpers import identity, test_ca


async def test_security_step_shows_each_refusal_and_the_audit_log(
    redis_url, capsys, spans_factory, tmp_path, monkeypatch
):
    state = tmp_path / "state"
    state.mkdir()
    (state / "pki").symlink_to(test_ca().dir)  # the stack's CA is the tests' CA here
    identity("service:workload_scheduler/pod-2")
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(state))
    audit = state / "audit" / "cell-scheduler.jsonl"
    async with cell_stack(
        redis_url,
        pods=(("pod-1", 8, "tpu"),),
        cell_env={"LIGHTPATH_AUDIT_LOG": str(audit)},
    ) as cell:
        endpoints = {"cell-scheduler": cell.cell_addresses[0], **cell.ocs_addresses}
        ctx = DemoContext(endpoints, spans_factory("demo").provider)
        try:
            await demo.run(ctx)
        finally:
            await ctx.close()
        out = capsys.readouterr().out
        rows = {line[:50]: line for line in out.splitlines()}
        text = "\n".join(rows.values())
        assert "OK: tenant acme, JOB_STATE_RUNNING" in text
        assert 'NOT_FOUND: job "acme-demo" not found' in text
        assert "PERMISSION_DENIED: tenant:acme may not call ListPods" in text
        assert "PERMISSION_DENIED: service:workload_scheduler/pod-2 serves pod-2" in text
        assert "UNAVAILABLE: refused at the TLS handshake" in text
        # the audit table is the cell's log: acme's submit, beta's refused cancel
        assert "tenant:beta  CancelJob  NOT_FOUND" in out
        assert "tenant:acme  ListPods   PERMISSION_DENIED" in out
        # and the step cleaned up: acme's job is cancelled, nothing of it runs
        job = await cell.cell.GetJob(cs.GetCellJobRequest(job_id="acme-demo"))
        assert job.state == common_pb2.JOB_STATE_CANCELLED and job.tenant == "acme"
