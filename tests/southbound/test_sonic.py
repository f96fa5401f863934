"""The SONiC OCS driver against a real redis-server playing the switch's CONFIG_DB and
STATE_DB, with the orchagent emulator moving ports through `tuning` (issue 34)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import grpc
import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lightpath.client import error_report
from lightpath.domain.southbound import devices
from lightpath.domain.switch_timing import SwitchTiming
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath_services.ocs_manager.sonic_driver import SonicSwitch
from lightpath_services.switch_emulators import sonic as sonic_emulator
from lightpath_services.switch_emulators.sonic import StampedSocket, arrival
from tests.southbound.labs import sonic_lab

FABRIC = Fabric.build(
    FabricConfig(block_shape=(2, 2, 2), block_count=4, ocs_per_axis=1, ocs_radix=12)
)
SID = "ocs-x-0-0"
DEVICE = next(d for d in devices(FABRIC) if d.id == SID)


def batch(key: str, connect=(), disconnect=(), fence=None) -> pb.ApplyBatchRequest:
    return pb.ApplyBatchRequest(
        switch_id=SID,
        batch_id=key,
        connect=[pb.PortPair(port_a=p, port_b=q) for p, q in connect],
        disconnect=[pb.PortPair(port_a=p, port_b=q) for p, q in disconnect],
        fence=None if fence is None else pb.Fence(lease_id=fence[0], token=fence[1]),
    )


async def config_db(lab) -> dict[str, dict[str, str]]:
    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    try:
        return {k: await r.hgetall(k) async for k in r.scan_iter("OCS_CROSS_CONNECT|*")}  # type: ignore[misc]
    finally:
        await r.aclose()


@pytest.fixture
async def lab(tmp_path):
    async with sonic_lab(FABRIC, tmp_path, timing=SwitchTiming(1.0, 4.0, 10.0), only={SID}) as lab:
        yield lab


@pytest.fixture
async def switch(lab):
    sw = SonicSwitch(FABRIC, DEVICE, lab[SID].url, settle_timeout_s=5)
    yield sw
    await sw.close()


async def test_batches_write_the_hld_tables_and_wait_for_tuned(lab, switch):
    # first ends 0..3 are A-side 1A..4A, second ends 4..7 are B-side 1B..4B
    reply = await switch.ApplyBatch(batch("k1", connect=[(4, 1), (5, 0)]), timeout=5)
    assert reply.applied.connects == 2
    assert await config_db(lab) == {
        "OCS_CROSS_CONNECT|2A-1B": {"a_side": "2A", "b_side": "1B"},
        "OCS_CROSS_CONNECT|1A-2B": {"a_side": "1A", "b_side": "2B"},
    }
    state = await switch.GetPortStatus(pb.GetPortStatusRequest(switch_id=SID))
    by_port = {p.port: p for p in state.ports}
    assert by_port[4].state == pb.PORT_STATE_CONNECTED and by_port[4].peer == 1
    assert by_port[2].state == pb.PORT_STATE_DARK
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(1, 4), (0, 5)}
    assert st.version == reply.version and st.boot_id == reply.boot_id
    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    assert (await r.hget("OCS_PORT|2A", "label")).startswith("lightpath ocs-x-0-0 block 1")
    await r.aclose()

    # re-patch: the driver deletes before it adds, in one transaction: no conflict to resolve
    orch = lab[SID].orchagent
    before = len(orch.settles)
    await switch.ApplyBatch(batch("k2", connect=[(4, 0)]), timeout=5)
    assert await config_db(lab) == {"OCS_CROSS_CONNECT|1A-1B": {"a_side": "1A", "b_side": "1B"}}
    assert orch.settles[before:] == [pytest.approx(orch.timing.settle_s(4, 12, conflicts=0))]

    # absolute and idempotent: the same key answers the same, a repeat changes nothing
    again = await switch.ApplyBatch(batch("k2", connect=[(4, 0)]), timeout=5)
    assert again.replayed
    assert (await switch.ApplyBatch(batch("k3", disconnect=[(5, 1)]), timeout=5)).applied
    assert len(await config_db(lab)) == 1


async def test_device_rules_and_errors_map_to_the_contract(lab, switch):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("a", connect=[(0, 1)]), timeout=5)  # A to A
    rep = error_report(err.value)
    assert rep.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "A side" in str(rep.field_violations)

    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    await r.hset("OCS_PORT|3A", "state", "force_blocked")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("b", connect=[(6, 2)]), timeout=5)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.ABORTED, "BATCH_REJECTED")
    assert "3A" in rep.message and rep.metadata["applied_connects"] == "0"
    assert await config_db(lab) == {}
    await r.hset("OCS_PORT|3A", "state", "normal")
    await r.aclose()

    lab[SID].orchagent.fail_ports.add("4B")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("c", connect=[(7, 3)]), timeout=5)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.UNAVAILABLE, "PARTIALLY_APPLIED")
    assert "applied_connects" not in rep.metadata  # committed: counts as touched

    # a stale writer is refused
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    stale = batch("d", connect=[(4, 0)])
    stale.expect_version = st.version + 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(stale, timeout=5)
    assert error_report(err.value).reason == "VERSION_MISMATCH"

    lab[SID].server.stop()  # the switch's Redis goes away
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("e", connect=[(4, 0)]), timeout=5)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.UNAVAILABLE, "SWITCH_UNREACHABLE")
    assert rep.metadata["applied_connects"] == "0"
    # out of reach before anything was sent: not accepted, so the key was not kept and
    # the same key is a new attempt once the switch is back (docs: Idempotency)
    await lab[SID].restart_empty()
    reply = await switch.ApplyBatch(batch("e", connect=[(4, 0)]), timeout=5)
    assert reply.applied.connects == 1 and not reply.replayed


async def test_a_write_between_the_read_and_exec_refuses_the_batch(lab, switch):
    # the batch WATCHes what it touches in the same round trip as its read: an operator's
    # force_blocked landing after that read makes EXEC run nothing
    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    commit = switch._commit

    async def operator_meanwhile(*args):
        await r.hset("OCS_PORT|3A", "state", "force_blocked")
        await commit(*args)

    switch._commit = operator_meanwhile
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("w1", connect=[(6, 2)]), timeout=5)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "VERSION_MISMATCH")
    assert rep.metadata["applied_connects"] == "0"
    assert await config_db(lab) == {}
    switch._commit = commit
    # read again, the port is refused by name; once it is back the batch goes through on
    # the same pooled connections (no WATCH left behind)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("w2", connect=[(6, 2)]), timeout=5)
    assert error_report(err.value).reason == "BATCH_REJECTED"
    await r.hset("OCS_PORT|3A", "state", "normal")
    await r.aclose()
    reply = await switch.ApplyBatch(batch("w3", connect=[(6, 2)]), timeout=5)
    assert reply.applied.connects == 1
    assert await config_db(lab) == {"OCS_CROSS_CONNECT|3A-3B": {"a_side": "3A", "b_side": "3B"}}


async def test_describe_reads_the_inventory(lab, switch):
    d = await switch.Describe(pb.DescribeSwitchRequest(switch_id=SID))
    assert d.kind == pb.SWITCH_KIND_OCS and d.ports == 8  # 4 first ends + 4 second ends
    assert d.model == "Lightpath-OCS-emulator"
    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    await r.hset("DEVICE_METADATA|localhost", "switch_type", "fabric")
    await r.aclose()
    d = await switch.Describe(pb.DescribeSwitchRequest(switch_id=SID))
    assert d.kind == pb.SWITCH_KIND_UNSPECIFIED


async def test_settling_is_heard_from_state_db_not_polled(tmp_path, monkeypatch):
    # orchagent takes 60 ms: a driver polling every 1-10 ms would read STATE_DB a dozen
    # times a batch; one hearing the keyspace notification of the batch's cross-connect in
    # STATE_DB reads it once it is written (as SONiC's SubscriberStateTable does)
    async with sonic_lab(FABRIC, tmp_path, timing=SwitchTiming.fixed(60.0), only={SID}) as lab:
        sw = SonicSwitch(FABRIC, DEVICE, lab[SID].url, settle_timeout_s=5)
        probes = 0
        hmget = sw.state.hmget

        async def counted(*args, **kwargs):
            nonlocal probes
            probes += 1
            return await hmget(*args, **kwargs)

        monkeypatch.setattr(sw.state, "hmget", counted)
        try:
            await sw.ApplyBatch(batch("n1", connect=[(4, 1)]), timeout=5)
            probes = 0
            await sw.ApplyBatch(batch("n2", connect=[(5, 0)]), timeout=5)
            reply = await sw.ApplyBatch(batch("n3", disconnect=[(4, 1)]), timeout=5)
            assert sw._notified and probes == 0
            assert reply.applied.disconnects == 1
            st = await sw.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
            assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(0, 5)}

            # a switch whose notifications cannot be heard is polled: slower, as correct
            def deaf():
                raise RedisError("no pubsub here")

            await sw._deafen()
            sw._notified = False
            monkeypatch.setattr(sw.state, "pubsub", deaf)
            probes = 0
            await sw.ApplyBatch(batch("n4", connect=[(6, 2)]), timeout=5)
            assert probes > 3
            ports = await sw.GetPortStatus(pb.GetPortStatusRequest(switch_id=SID))
            assert {p.port: p.peer for p in ports.ports if p.HasField("peer")}[6] == 2
        finally:
            await sw.close()


async def test_a_switch_out_of_reach_when_described_is_described_before_it_is_programmed(
    tmp_path,
):
    from lightpath_services.ocs_manager.agent_driver import AgentSwitchDriver, ScopedChange
    from lightpath_services.ocs_manager.driver import SwitchDriverError
    from lightpath_services.ocs_manager.wiring import SlicePlacement, wire_change

    async with sonic_lab(FABRIC, tmp_path, only={SID}, short={SID}) as lab:
        lab[SID].server.stop()  # down while the manager starts
        stubs = {
            d.id: SonicSwitch(FABRIC, d, lab[SID].url if d.id == SID else "sonic://127.0.0.1:9")
            for d in devices(FABRIC)
        }
        driver = AgentSwitchDriver(FABRIC, stubs, timeout_s=2)
        try:
            assert await driver.check_inventory([SID]) == {}  # not judged: it did not answer
            assert SID in driver.undescribed and SID not in driver.mismatched
            await lab[SID].restart_empty()  # back, with one B port short of the fabric
            full = wire_change(FABRIC, SlicePlacement("j", (2, 1, 1), (0, 1), (True,) * 3))
            only = ScopedChange(
                full.disconnect, full.connect, full.one_to_many, frozenset({DEVICE.index})
            )
            with pytest.raises(SwitchDriverError) as err:
                await driver.apply(only)
            assert f"switch {SID} does not match the fabric" in str(err.value)
            assert SID in driver.mismatched and SID not in driver.undescribed
            assert await config_db(lab) == {}  # never programmed
        finally:
            for sw in stubs.values():
                await sw.close()


async def test_a_batch_planned_without_a_read_is_guarded_by_the_switch(lab, switch):
    """After a read, a batch is planned on the table the driver knows and written by one
    script that checks every pair it touches (GUARDED_LUA): another writer's change, an
    operator's force_blocked or a restarted Redis refuse it with nothing written."""
    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    await switch.ApplyBatch(batch("u1", connect=[(4, 1), (5, 0)]), timeout=5)
    assert (switch.stats.planned_unread, switch.stats.replans) == (1, 0)
    assert (await r.hget("OCS_PORT|2A", "label")).startswith("lightpath ocs-x-0-0 block 1")

    # another writer removed 2A-1B (ports 1-4): the driver's delete of it is refused, the
    # batch reads the table and plans again (the disconnect is then nothing)
    await r.delete("OCS_CROSS_CONNECT|2A-1B")
    reply = await switch.ApplyBatch(batch("u2", disconnect=[(4, 1)], connect=[(7, 2)]), timeout=5)
    assert (switch.stats.planned_unread, switch.stats.replans) == (2, 1)
    assert await config_db(lab) == {
        "OCS_CROSS_CONNECT|1A-2B": {"a_side": "1A", "b_side": "2B"},
        "OCS_CROSS_CONNECT|3A-4B": {"a_side": "3A", "b_side": "4B"},
    }
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert reply.version == st.version

    # an operator's force_blocked: refused by name, nothing written
    await r.hset("OCS_PORT|4A", "state", "force_blocked")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("u3", connect=[(6, 3)]), timeout=5)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.ABORTED, "BATCH_REJECTED")
    assert "4A" in rep.message and switch.stats.planned_unread == 3
    assert len(await config_db(lab)) == 2
    await r.aclose()

    # the switch restarts empty (a new run id) after the driver last read it: refused,
    # read again on a new connection, applied
    await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    await lab[SID].restart_empty()
    reply = await switch.ApplyBatch(batch("u4", connect=[(6, 3)]), timeout=5)
    assert (switch.stats.planned_unread, switch.stats.replans) == (4, 2)
    assert await config_db(lab) == {"OCS_CROSS_CONNECT|4A-3B": {"a_side": "4A", "b_side": "3B"}}
    assert reply.boot_id == (await switch.GetCrossConnects(pb.GetCrossConnectsRequest())).boot_id


async def test_a_paused_replicas_late_batch_is_refused_by_the_switch_itself(lab, switch):
    """Fencing on the device: two ocs_manager replicas drive one SONiC switch; the one
    that took a slice's change over (token 5) rolled it back, so the batch the paused
    holder (token 4) sends when it wakes is refused by the switch's own script,
    whichever way it is written, with nothing written. A batch that moves nothing still
    records its token."""

    async def refused(sw, key, **kw):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sw.ApplyBatch(batch(key, **kw), timeout=5)
        rep = error_report(err.value)
        assert (rep.code, rep.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "STALE_LEASE")
        assert "lease job-a" in rep.message and "token 5" in rep.message

    r = aioredis.Redis(port=lab[SID].server.port, db=4, decode_responses=True)
    paused = SonicSwitch(FABRIC, DEVICE, lab[SID].url, settle_timeout_s=5)
    try:
        await switch.ApplyBatch(batch("t1", connect=[(4, 1)], fence=("job-b", 3)), timeout=5)
        # the new holder's rollback moves nothing here: its token is kept all the same
        await switch.ApplyBatch(batch("t2", disconnect=[(5, 0)], fence=("job-a", 5)), timeout=5)
        assert await r.hget("LIGHTPATH_FENCE|job-a", "token") == "5"
        assert 0 < await r.pttl("LIGHTPATH_FENCE|job-a")  # kept for a time, not for ever
        before = await config_db(lab)

        # the paused holder's batch, planned on a read (WATCH, then MULTI/EXEC)
        await refused(paused, "late1", connect=[(5, 0)], fence=("job-a", 4))
        # and planned on the table it knew, without a read (the guarded script)
        await paused.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
        await refused(paused, "late2", connect=[(5, 0)], fence=("job-a", 4))
        assert paused.stats.planned_unread == 1 and paused.stats.stale_batches_refused == 2
        assert await config_db(lab) == before
        assert await r.hget("LIGHTPATH_FENCE|job-a", "token") == "5"

        # the holder's own batches, another lease's older token and unfenced ones go on
        await paused.ApplyBatch(batch("t3", connect=[(5, 0)], fence=("job-a", 5)), timeout=5)
        await paused.ApplyBatch(batch("t4", connect=[(6, 3)], fence=("job-c", 1)), timeout=5)
        await switch.ApplyBatch(batch("t5", disconnect=[(6, 3)]), timeout=5)
        assert set(await config_db(lab)) == {
            "OCS_CROSS_CONNECT|2A-1B",
            "OCS_CROSS_CONNECT|1A-2B",
        }
        # a batch that moves nothing under an older token is refused too
        await refused(switch, "late3", disconnect=[(7, 2)], fence=("job-a", 4))
    finally:
        await paused.close()
        await r.aclose()


def test_a_stamped_socket_notes_when_its_bytes_arrived_not_when_they_were_read():
    """What the Polatis emulator's SSH connections read through: an edit that waited in
    the kernel while the emulator's loop was busy with other switches was heard when it
    arrived, so its settling is not lengthened by that wait."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    sock = StampedSocket.adopt(conn)
    try:
        assert sock.arrived is None
        # the kernel turns its receive stamps on a moment after the first socket asks
        # (deferred work): until then a read notes when it was read, never earlier
        for _ in range(50):
            sent = time.monotonic()
            client.sendall(b"<rpc/>")
            time.sleep(0.02)  # the bytes wait unread (a busy loop)
            read = time.monotonic()
            assert sock.recv(1024) == b"<rpc/>"
            assert sock.arrived is not None and sent <= sock.arrived
            if sock.arrived < read:  # the kernel's stamp: before the read
                break
        else:
            pytest.fail("no read carried the kernel's arrival stamp")
    finally:
        for s in (sock, client, listener):
            s.close()


def test_arrival_is_the_kernels_stamp_on_the_loops_clock():
    stamp = struct.pack("@qq", 1_000, 250_000_000)  # 1000.25 s on the wall clock
    got = arrival([(socket.SOL_SOCKET, sonic_emulator._SO_TIMESTAMPNS, stamp)], 50.0, 1000.75)
    assert got == pytest.approx(49.5)  # it arrived half a second before `now`
    assert arrival([], 50.0, 1000.75) == 50.0  # no stamp: when it was read
    # a stamp from the future or long ago (the wall clock stepped) is not believed
    assert (
        arrival([(socket.SOL_SOCKET, sonic_emulator._SO_TIMESTAMPNS, stamp)], 50.0, 999.0) == 50.0
    )
    assert arrival([(socket.SOL_SOCKET, sonic_emulator._SO_TIMESTAMPNS, stamp)], 50.0, 2e3) == 50.0


async def test_orchagent_hears_a_change_when_it_arrived_not_when_its_process_got_to_it(
    lab, monkeypatch
):
    # the emulator plays 48 switches in one process on shared cores: busy with others, it
    # reads a switch's notification late, but the switch heard the change when it arrived
    # (the kernel's stamp), and its mirrors settle from then
    orch = lab[SID].orchagent
    heard: list[float | None] = []
    apply = orch._apply

    async def recorded(at=None):
        heard.append(at)
        await apply(at)

    await orch.wait_idle()  # its warm start applied
    monkeypatch.setattr(orch, "_apply", recorded)
    r = redis.Redis(port=lab[SID].server.port, db=4)  # blocking: the loop runs nothing
    try:
        r.hset("OCS_CROSS_CONNECT|1A-1B", mapping={"a_side": "1A", "b_side": "1B"})
        committed = asyncio.get_running_loop().time()
        time.sleep(0.3)  # noqa: ASYNC251 (the process busy elsewhere: nothing read meanwhile)
        async with asyncio.timeout(5):
            while not heard:
                await asyncio.sleep(0.001)
        await orch.wait_idle()
    finally:
        r.close()
    assert len(heard) == 1 and heard[0] is not None
    assert heard[0] < committed + 0.1  # not when the loop woke, 0.3 s later
    assert orch.applied == {"1A-1B": ("1A", "1B")}


async def test_a_command_leaves_when_it_is_given_not_after_every_ready_task(lab, monkeypatch):
    # a full pod's 48 batches are prepared one after another in one pass of the loop: each
    # switch's write must leave when it is ready, not once every other batch was prepared
    sw = SonicSwitch(FABRIC, DEVICE, lab[SID].url, settle_timeout_s=5)
    order: list[str] = []
    try:
        conn = await sw.config.connection_pool.get_connection()
        write = conn._send_packed_command

        async def recorded(command):
            order.append("written")
            await write(command)

        monkeypatch.setattr(conn, "_send_packed_command", recorded)

        async def later() -> None:
            order.append("the next ready task")

        first = asyncio.create_task(conn.send_packed_command(conn.pack_command("PING")))
        second = asyncio.create_task(later())
        await asyncio.gather(first, second)
        assert order == ["written", "the next ready task"]
        assert await conn.read_response() == "PONG"
        await sw.config.connection_pool.release(conn)

        # a write that cannot finish in the socket timeout is the error redis-py raises
        conn = await sw.config.connection_pool.get_connection()
        conn.socket_timeout = 0.05

        async def stuck(command):
            await asyncio.sleep(5)

        monkeypatch.setattr(conn, "_send_packed_command", stuck)
        with pytest.raises(RedisTimeoutError):
            await conn.send_packed_command(conn.pack_command("PING"))
        assert conn.socket_timeout == 0.05 and not conn.is_connected
        await sw.config.connection_pool.release(conn)
    finally:
        await sw.close()


async def test_orchagent_says_so_when_its_notifications_end(lab, caplog):
    # without its notifications the emulated switch applies nothing more: never quietly
    r = aioredis.Redis(port=lab[SID].server.port, decode_responses=True)
    try:
        await r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    finally:
        await r.aclose()
    async with asyncio.timeout(5):
        while "notification connection ended" not in caplog.text:
            await asyncio.sleep(0.01)
    assert lab[SID].orchagent._notes is None
    assert "CONFIG_DB changes are no longer applied" in caplog.text
