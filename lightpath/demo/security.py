"""Demo step of security: who may do what, and the audit log that says who did."""

from __future__ import annotations

import json

import grpc

from lightpath.cli._common import table
from lightpath.client import channel, error_report
from lightpath.demo.context import DemoContext
from lightpath.paths import default_state_dir, pki_dir
from lightpath.security.credentials import Credentials
from lightpath.security.identity import TENANT, Principal, service_principal
from lightpath.security.pki import LocalCA
from lightpath.stack import running_stack
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as om
from lightpath.v1 import workload_scheduler_pb2 as ws


async def _outcome(call) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        report = error_report(err)
        return f"{report.code.name}: {report.message}"
    return "OK"


async def run(ctx: DemoContext) -> None:
    ctx.section("security: every caller is someone, and may do only its part")
    state = default_state_dir()
    stack = running_stack(state)
    if stack is not None and not stack.tls:
        print("this stack runs plaintext (bearer tokens only); the TLS stack shows more")
        return
    ca = LocalCA(pki_dir(state))
    for tenant in ("acme", "beta"):
        ca.issue(Principal(TENANT, tenant))
    cell = ctx.endpoints["cell-scheduler"]
    rows = []
    async with (
        channel(cell, credentials=Credentials.local(Principal(TENANT, "acme"), state)) as a_ch,
        channel(cell, credentials=Credentials.local(Principal(TENANT, "beta"), state)) as b_ch,
        channel(
            ctx.endpoints["ocs-pod-1"],
            credentials=Credentials.local(service_principal("workload_scheduler", "pod-2"), state),
            max_attempts=1,
        ) as ws2_ch,
        channel(cell, credentials=Credentials(ca=ca.cert_path.read_bytes(), tls=True)) as anon,
    ):
        acme = cell_scheduler_pb2_grpc.CellSchedulerStub(a_ch)
        beta = cell_scheduler_pb2_grpc.CellSchedulerStub(b_ch)
        sub = await acme.SubmitJob(
            cs.SubmitJobRequest(
                spec=ws.JobSpec(job_id="acme-demo", shape=common_pb2.Shape(dims=[4, 4, 4]))
            )
        )
        rows.append(
            (
                "tenant acme",
                "submit acme-demo (no tenant field)",
                f"OK: tenant {sub.job.tenant}, {common_pb2.JobState.Name(sub.job.state)}",
            )
        )
        rows.append(
            (
                "tenant beta",
                "cancel acme-demo",
                await _outcome(beta.CancelJob(cs.CancelCellJobRequest(job_id="acme-demo"))),
            )
        )
        listed = await beta.ListJobs(cs.ListCellJobsRequest())
        rows.append(("tenant beta", "list jobs", f"OK: {len(listed.jobs)} job(s) of its own"))
        rows.append(
            (
                "tenant acme",
                "list superpods",
                await _outcome(acme.ListPods(cs.ListPodsRequest())),
            )
        )
        rows.append(
            (
                "pod-2's scheduler",
                "release a slice on pod-1",
                await _outcome(
                    ocs_manager_pb2_grpc.OcsManagerStub(ws2_ch).ReleaseSlice(
                        om.ReleaseSliceRequest(job_id="acme-demo")
                    )
                ),
            )
        )
        rows.append(
            (
                "no certificate",
                "list jobs",
                (
                    await _outcome(
                        cell_scheduler_pb2_grpc.CellSchedulerStub(anon).ListJobs(
                            cs.ListCellJobsRequest(), timeout=3
                        )
                    )
                ).split(":")[0]
                + ": refused at the TLS handshake",
            )
        )
        await acme.CancelJob(cs.CancelCellJobRequest(job_id="acme-demo", reason="demo"))
    print(table([(w, what, out[:110]) for w, what, out in rows], ["caller", "asks to", "answer"]))
    audit = state / "audit" / "cell-scheduler.jsonl"
    if audit.exists():
        lines = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
        mine = [e for e in lines if e["principal"].startswith("tenant:")][-5:]
        print(f"\nthe cell's audit log ({audit}), `lightpath audit` reads it:")
        print(
            table(
                [
                    (e["ts"], e["principal"], e["method"].rsplit("/", 1)[-1], e["code"])
                    for e in mine
                ],
                ["time", "principal", "method", "outcome"],
            )
        )
