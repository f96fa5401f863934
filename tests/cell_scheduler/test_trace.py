"""X-2 through the cell: one submission is one trace with spans from the cell, the pod's
workload scheduler and its ocs_manager (each service with its own tracer provider)."""

from __future__ import annotations

from opentelemetry.trace import SpanKind

from tests.cell_scheduler.conftest import cell_stack

SERVICES = ("cell_scheduler", "workload_scheduler", "ocs_manager")


async def test_one_submission_is_one_trace_across_cell_workload_and_ocs(redis_url, spans_factory):
    spans = {s: spans_factory(f"lightpath-{s}") for s in SERVICES}
    async with cell_stack(
        redis_url,
        pods=(("pod-t", 4, "tpu"),),
        tracer_providers={s: sp.provider for s, sp in spans.items()},
    ) as cell:
        for sp in spans.values():
            sp.exporter.clear()  # registration and heartbeats are traces of their own
        resp = await cell.submit("traced", (8, 4, 4))
        assert resp.job.state == 3  # RUNNING
    submit = [
        s
        for s in spans["cell_scheduler"].finished()
        if s.name.endswith("CellScheduler/SubmitJob") and s.kind == SpanKind.SERVER
    ]
    assert len(submit) == 1
    trace_id = submit[0].context.trace_id
    assert submit[0].attributes["lightpath.job_id"] == "traced"
    assert submit[0].attributes["lightpath.pod_id"] == "pod-t"

    def in_trace(service: str) -> list:
        return [s for s in spans[service].finished() if s.context.trace_id == trace_id]

    names = {s: {x.name for x in in_trace(s)} for s in SERVICES}
    assert "lightpath.v1.WorkloadScheduler/AdmitJob" in names["cell_scheduler"]  # its client span
    assert "lightpath.v1.WorkloadScheduler/AdmitJob" in names["workload_scheduler"]
    assert "lightpath.v1.OcsManager/WireSlice" in names["ocs_manager"]
    for service in SERVICES:
        resource = {s.resource.attributes["service.name"] for s in in_trace(service)}
        assert resource == {f"lightpath-{service}"}
    admit = next(
        s
        for s in in_trace("workload_scheduler")
        if s.name.endswith("AdmitJob") and s.kind == SpanKind.SERVER
    )
    assert admit.attributes["lightpath.job_id"] == "traced"


async def test_a_cli_command_is_the_root_of_its_trace_and_prints_its_id(
    redis_url, spans_factory, capsys, monkeypatch
):
    """X-2 from the CLI: `lightpath --verbose submit` prints its trace id, and the
    cell's, the pod's and the ocs_manager's spans of that submission carry it; an error
    prints the trace id of the failed command too."""
    import asyncio
    import re

    from lightpath.cli import main

    spans = {s: spans_factory(f"lightpath-{s}") for s in SERVICES}
    async with cell_stack(
        redis_url,
        pods=(("pod-t", 4, "tpu"),),
        tracer_providers={s: sp.provider for s, sp in spans.items()},
    ) as cell:
        monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell.cell_addresses[0])
        capsys.readouterr()
        code = await asyncio.to_thread(
            main, ["--verbose", "submit", "cli-traced", "--shape", "8x4x4"]
        )
        out = capsys.readouterr()
        assert code == 0, out.err
        printed = re.findall(r"^trace: ([0-9a-f]{32})$", out.err, re.M)
        assert len(printed) == 1, out.err
        trace_id = int(printed[0], 16)

        def names(service: str) -> set[str]:
            return {s.name for s in spans[service].finished() if s.context.trace_id == trace_id}

        assert "lightpath.v1.CellScheduler/SubmitJob" in names("cell_scheduler")
        assert "lightpath.v1.WorkloadScheduler/AdmitJob" in names("workload_scheduler")
        assert "lightpath.v1.OcsManager/WireSlice" in names("ocs_manager")

        # a failing command: the error, then its own trace id (not the last one's)
        code = await asyncio.to_thread(main, ["job", "no-such-job"])
        err = capsys.readouterr().err
        assert code == 1 and "NOT_FOUND" in err, err
        failed = re.findall(r"^trace: ([0-9a-f]{32})$", err, re.M)
        assert len(failed) == 1 and failed[0] != printed[0], err

        async def get_job():
            # The server ends its span as the answer goes out: the CLI may read the
            # answer first (CI saw the span missing at load 14), so wait for it, bounded.
            return [
                s
                for s in spans["cell_scheduler"].finished()
                if s.context.trace_id == int(failed[0], 16) and s.name.endswith("GetJob")
            ]

        await cell.wait_for(get_job, what="the cell's span of the failed call in its trace")
