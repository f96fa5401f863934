"""The demo step shows the seed's three scenarios (001 Fig. 2, 3, 4) and leaves nothing behind."""

from __future__ import annotations

from lightpath.demo import DemoContext
from lightpath.demo import cores as demo
from lightpath.telemetry import configure_tracing
from lightpath.v1 import core_broker_pb2 as pb
from tests.core_broker.conftest import OP, OPERATOR_TOKEN, running_broker
from tests.helpers import PATENT_REFERENCE, identity


async def test_the_demo_shows_fig2_fig3_fig4_and_cleans_up(redis_url, capsys, monkeypatch):
    # the operator by its token here (the channel presents a tenant's certificate, which
    # alone may not call the broker); tests/graph/test_demo.py: by its certificate alone
    files = identity("tenant:demo")
    monkeypatch.setenv("LIGHTPATH_TLS_CERT", str(files.cert))
    monkeypatch.setenv("LIGHTPATH_TLS_KEY", str(files.key))
    monkeypatch.setenv("LIGHTPATH_CB_OPERATOR_TOKEN", OPERATOR_TOKEN)
    # a wide window: the two concurrent requests of Fig. 3/4 surely share a batch
    async with running_broker(redis_url, LIGHTPATH_CB_BATCH_WINDOW_MS="200") as b:
        ctx = DemoContext({"core-broker": b.address}, configure_tracing("t", set_global=False))
        try:
            await demo.run(ctx)
        finally:
            await ctx.close()
        out = capsys.readouterr().out
        assert not PATENT_REFERENCE.search(out)  # figures and paragraphs stay in the docs
        fig2, rest = out.split("conflicting requests, the lower partially now")
        fig3, fig4 = rest.split("conflicting requests, the lower deferred")
        assert fig2.count("GRANTED") == 3
        assert "25@" in fig2 and "21@" in fig2 and "10@" in fig2
        assert "GRANTED" in fig3 and "PARTIAL" in fig3 and "30 cores now, 20 more in 2 s" in fig3
        assert "PART_STARTED" in fig3 and "ENDED" in fig3
        assert "GRANTED" in fig4 and "DEFERRED" in fig4 and "50 cores in 2 s" in fig4
        assert "STARTED      cores held: 50" in fig4
        devices = await b.stub.ListDevices(pb.ListDevicesRequest(), metadata=OP)
        assert list(devices.devices) == []
