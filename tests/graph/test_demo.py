"""The demo step plans Fig. 2A on the broker, reserves, runs it folded, shows its metrics, and cleans up."""

from __future__ import annotations

from lightpath.demo import DemoContext
from lightpath.demo import graph as demo
from lightpath.telemetry import configure_tracing
from lightpath.v1 import core_broker_pb2 as pb
from tests.core_broker.conftest import running_broker
from tests.helpers import PATENT_REFERENCE


async def test_the_demo_folds_reserves_runs_and_reports_fig_2a(redis_url, capsys, monkeypatch):
    # no operator token: the operator's certificate (tests/conftest.py) alone
    monkeypatch.delenv("LIGHTPATH_CB_OPERATOR_TOKEN", raising=False)
    monkeypatch.setattr(demo, "RECORDS", 3000)
    async with running_broker(redis_url, LIGHTPATH_CB_OPERATOR_TOKEN="") as b:
        ctx = DemoContext({"core-broker": b.address}, configure_tracing("t", set_global=False))
        try:
            await demo.run(ctx)
        finally:
            await ctx.close()
        out = capsys.readouterr().out
        assert not PATENT_REFERENCE.search(out)  # figures and paragraphs stay in the docs
        plan, run = out.split("run folded here")
        assert "204A 204B 204E 204F 204G 204C 204D" in plan and "204I 204J" in plan
        assert "10 one per component -> 3 folded" in plan
        assert plan.count("GRANTED") == 3
        assert "3000 records" in run and "by 3 processes" in run
        for component in ("204A", "204H", "204J"):
            assert f"\n{component} " in run
        devices = await b.stub.ListDevices(pb.ListDevicesRequest())
        assert list(devices.devices) == []
        listed = await b.stub.ListReservations(pb.ListReservationsRequest())
        assert all(r.state == pb.RESERVATION_STATE_RELEASED for r in listed.reservations)
