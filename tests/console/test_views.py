"""The console's pure parts (issue 21): the core timeline's free-capacity steps, the
settings' parsers and the safe default for viewers who have not signed in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath_services.common.settings import SettingsError, load
from lightpath_services.common.tls import is_loopback
from lightpath_services.console.settings import ConsoleSettings, parse_named_addresses
from lightpath_services.console.views import (
    CORES_MAX_S,
    CORES_MIN_S,
    cell_view,
    cores_window,
    free_steps,
    live_reservations,
    quota_row,
)


@st.composite
def schedules(draw):
    total = draw(st.integers(1, 64))
    bars = []
    for _ in range(draw(st.integers(0, 8))):
        start = draw(st.integers(0, 100))
        end = draw(st.integers(start + 1, 120))
        bars.append({"start": float(start), "end": float(end), "cores": draw(st.integers(1, 8))})
    return total, bars


@given(schedules(), st.integers(0, 119))
def test_free_steps_say_the_free_cores_at_every_instant(schedule, t):
    """At any instant from the window's start, the step in force is the total less the
    cores of every bar covering that instant; consecutive steps differ."""
    total, bars = schedule
    steps = free_steps(total, bars, 0.0)
    assert steps[0][0] == 0.0
    assert all(a[0] < b[0] and a[1] != b[1] for a, b in itertools.pairwise(steps))
    in_force = [free for at, free in steps if at <= t][-1]
    assert in_force == total - sum(b["cores"] for b in bars if b["start"] <= t < b["end"])


def test_free_steps_of_an_idle_device_is_one_step():
    assert free_steps(16, [], 5.0) == [[5.0, 16.0]]


def test_named_addresses_parse_and_say_the_rule():
    assert parse_named_addresses("pod-1=127.0.0.1:1, pod-2=h:2") == (
        ("pod-1", "127.0.0.1:1"),
        ("pod-2", "h:2"),
    )
    assert parse_named_addresses("") == ()
    with pytest.raises(ValueError, match="name=host:port"):
        parse_named_addresses("127.0.0.1:1")
    with pytest.raises(ValueError, match="port"):
        parse_named_addresses("pod-1=127.0.0.1:x")


def test_a_bad_setting_names_the_variable():
    with pytest.raises(SettingsError, match="LIGHTPATH_CONSOLE_ANONYMOUS"):
        load(ConsoleSettings, {"LIGHTPATH_CONSOLE_ANONYMOUS": "everyone"})
    with pytest.raises(SettingsError, match="LIGHTPATH_CONSOLE_OCS_ADDRS"):
        load(ConsoleSettings, {"LIGHTPATH_CONSOLE_OCS_ADDRS": "pod-1"})


@pytest.mark.parametrize(
    ("listen", "anonymous", "reads"),
    [
        ("127.0.0.1:8443", "auto", True),
        ("[::1]:8443", "auto", True),
        ("localhost:8443", "auto", True),
        ("0.0.0.0:8443", "auto", False),  # beyond loopback: sign in first
        ("10.0.0.5:8443", "auto", False),
        ("0.0.0.0:8443", "read", True),  # said outright
        ("127.0.0.1:8443", "none", False),
    ],
)
def test_viewers_without_sign_in_see_the_read_only_view_only_on_loopback_by_default(
    listen, anonymous, reads
):
    settings = load(
        ConsoleSettings,
        {"LIGHTPATH_CONSOLE_LISTEN": listen, "LIGHTPATH_CONSOLE_ANONYMOUS": anonymous},
    )
    assert settings.anonymous_reads() is reads
    assert is_loopback(listen) is (listen.startswith(("127.", "[::1]", "localhost")))


def test_the_default_listen_address_is_loopback():
    assert is_loopback(load(ConsoleSettings, {}).listen)


def test_the_console_never_reads_redis():
    """No module of the console imports Redis or the services' Redis layers: it is a client
    of the gRPC API only."""
    import ast
    from pathlib import Path

    forbidden = (
        "redis",
        "lightpath_services.common.redis_store",
        "lightpath_services.common.keys",
        "lightpath.embedded_redis",
    )
    console = Path(__file__).resolve().parents[2] / "services" / "lightpath_services" / "console"
    for path in console.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"


def _shared_pod():
    """A hand-made pod (issue 28): block 0-1 a twisted slice, block 5 shared by two
    sub-block slices, block 6 with a failed host."""
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import common_pb2 as c
    from lightpath.v1 import workload_scheduler_pb2 as w

    pod = cs.Pod(
        registration=cs.PodRegistration(pod_id="pod-1", block_shape=c.Shape(dims=[4, 4, 4]))
    )
    pod.capacity.types.append(
        cs.NodeTypeCapacity(
            node_type="tpu", total=8, free=4, chips_total=512, chips_free=375, largest_free_box=64
        )
    )
    v = pod.view
    v.pod_id, v.block_count = "pod-1", 8
    v.block_shape.dims.extend([4, 4, 4])
    v.host_shape.dims.extend([2, 2, 1])
    alloc = c.BLOCK_AVAILABILITY_ALLOCATED
    for b in range(8):
        v.blocks.append(w.BlockView(block_id=b, node_type="tpu", chips_free=64))
    for b in (0, 1):
        v.blocks[b].job_id, v.blocks[b].availability = "tw", alloc
    v.blocks[5].availability = alloc
    v.blocks[5].chips_free = 59
    v.blocks[5].boxes.add(
        block_id=5,
        offset=c.Coordinate(coords=[0, 2, 0]),
        chips=c.Shape(dims=[2, 2, 1]),
        job_id="small",
    )
    v.blocks[5].boxes.add(
        block_id=5,
        offset=c.Coordinate(coords=[2, 0, 0]),
        chips=c.Shape(dims=[1, 1, 1]),
        job_id="one",
    )
    v.blocks[6].failed_hosts.append(3)
    v.blocks[6].health = c.BLOCK_HEALTH_FAILED  # a failed host: no block slice may use it
    v.blocks[6].chips_free = 60
    for j in ("tw", "small", "one"):
        v.live_jobs.add(job_id=j, state=c.JOB_STATE_RUNNING, priority=50)
    v.types.add(
        node_type="tpu", total=8, chips_total=512, chips_used=133, chips_failed=4, chips_free=375
    )
    return pod


def test_the_superpod_view_gives_each_jobs_box_failed_hosts_and_twisted_slices():
    from lightpath_services.console.views import pod_view

    d = pod_view(_shared_pod(), 0.0, twisted={"tw"})
    assert d["block_dims"] == [4, 4, 4] and d["host_shape"] == [2, 2, 1]
    b5, b6 = d["blocks"][5], d["blocks"][6]
    assert b5["shared"] and b5["chips_free"] == 59 and not b5["job_id"]
    assert b5["boxes"] == [
        {"job_id": "small", "block_id": 5, "offset": [0, 2, 0], "chips": [2, 2, 1]},
        {"job_id": "one", "block_id": 5, "offset": [2, 0, 0], "chips": [1, 1, 1]},
    ]
    assert b6["failed_hosts"] == [3] and not b6["shared"] and b6["chips_free"] == 60
    assert [b["twisted"] for b in d["blocks"][:3]] == [True, True, False]
    jobs = {j["job_id"]: j for j in d["live_jobs"]}
    assert jobs["tw"]["twisted"] and jobs["tw"]["box"] is None
    assert jobs["small"]["box"]["offset"] == [0, 2, 0] and not jobs["small"]["twisted"]
    assert d["chips"] == [{"node_type": "tpu", "total": 512, "used": 133, "failed": 4, "free": 375}]
    assert d["capacity"][0]["largest_free_box"] == 64 and d["capacity"][0]["chips_free"] == 375


def test_a_job_row_says_twisted_and_where_its_box_is():
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import common_pb2 as c
    from lightpath_services.console.views import job_row

    job = cs.CellJob(job_id="small", chips=c.Shape(dims=[2, 2, 1]))
    job.pod_job.box.block_id = 5
    job.pod_job.box.chips.dims.extend([2, 2, 1])
    job.pod_job.box.offset.coords.extend([0, 2, 0])
    row = job_row(job, 0.0)
    assert row["box"] == {"job_id": "", "block_id": 5, "offset": [0, 2, 0], "chips": [2, 2, 1]}
    assert row["twisted"] is False
    job.spec.twisted = True
    assert job_row(cs.CellJob(spec=job.spec), 0.0)["twisted"] is True


def _reservation(rid: str, start: float, end: float, state):
    from google.protobuf.timestamp_pb2 import Timestamp

    from lightpath.v1 import core_broker_pb2 as cb

    a, b = Timestamp(), Timestamp()
    a.FromNanoseconds(int(start * 1e9))
    b.FromNanoseconds(int(end * 1e9))
    return cb.Reservation(reservation_id=rid, state=state, start=a, end=b)


@given(ends=st.lists(st.floats(1, 30 * 86400), max_size=6), now=st.floats(0, 1e9))
def test_the_cores_timeline_reaches_the_last_reservation_in_whole_ticks(ends, now):
    """Issue 33: the axis fits what is shown: it ends at the last live reservation's end
    (within one tick), at least CORES_MIN_S and at most CORES_MAX_S from now, in 2 to 8
    whole ticks."""
    from lightpath.v1 import core_broker_pb2 as cb

    live = [
        _reservation(f"r{i}", now, now + e, cb.RESERVATION_STATE_ACTIVE) for i, e in enumerate(ends)
    ]
    end, tick = cores_window(live, now)
    last = min(CORES_MAX_S, max([CORES_MIN_S, *ends]))
    assert last <= end - now + 1e-3 <= CORES_MAX_S + 2e-3  # float seconds near 1e9
    assert end - now < last + tick
    assert 1 <= round((end - now) / tick) <= 8 or tick == 86400


def test_only_granted_reservations_not_yet_over_are_live():
    from lightpath.v1 import core_broker_pb2 as cb

    now = 1000.0
    rs = [
        _reservation("later", 1500, 1800, cb.RESERVATION_STATE_SCHEDULED),
        _reservation("now", 900, 1100, cb.RESERVATION_STATE_ACTIVE),
        _reservation("over", 100, 200, cb.RESERVATION_STATE_ENDED),
        _reservation("released", 900, 2000, cb.RESERVATION_STATE_RELEASED),
        _reservation("refused", 900, 2000, cb.RESERVATION_STATE_REJECTED),
    ]
    assert [r.reservation_id for r in live_reservations(rs, now)] == ["now", "later"]
    assert cores_window([], now) == (now + CORES_MIN_S, 120.0)


def test_a_quota_row_says_its_scope():
    from lightpath.v1 import cell_scheduler_pb2 as cs

    on_pod = cs.TenantQuota(
        tenant="acme",
        pod="pod-1",
        used_chips={"tpu": 64},
        quota=cs.Quota(tenant="acme", pod="pod-1", nominal_chips={"tpu": 128}),
    )
    row = quota_row(on_pod)
    assert row["pod"] == "pod-1" and row["has_quota"]
    assert row["types"] == [{"node_type": "tpu", "quota": 128, "used": 64, "borrowed": 0}]
    assert quota_row(cs.TenantQuota(tenant="acme"))["pod"] == ""  # the cell's row


def test_the_cell_view_carries_the_held_pod_as_the_cell_answered_it():
    """The hold as ListQuotas gives it (whose job left empty for another tenant: the
    view adds nothing), its age from `since`; none held: null."""
    from lightpath.v1 import cell_scheduler_pb2 as cs

    hold = cs.PodHold(pod="pod-2", job_id="a3", tenant="acme")
    hold.since.FromSeconds(1_000)
    assert cell_view([], [], 1_090.0, hold=hold)["hold"] == {
        "pod": "pod-2",
        "job_id": "a3",
        "tenant": "acme",
        "age_s": 90.0,
    }
    theirs = cell_view([], [], 1_090.0, hold=cs.PodHold(pod="pod-2"))["hold"]
    assert theirs["job_id"] == theirs["tenant"] == ""
    assert cell_view([], [], 1_090.0)["hold"] is None
