"""The console's pure parts (issue 21): the core timeline's free-capacity steps, the
settings' parsers and the safe default for viewers who have not signed in."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.settings import SettingsError, load
from services.common.tls import is_loopback
from services.console.settings import ConsoleSettings, parse_named_addresses
from services.console.views import free_steps


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
        "services.common.redis_store",
        "services.common.keys",
        "lightpath.embedded_redis",
    )
    console = Path(__file__).resolve().parents[2] / "services" / "console"
    for path in console.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
