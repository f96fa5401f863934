"""`lightpath cores ...` against a real broker (X-6: every read has --json)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lightpath.cli import build_parser, main
from lightpath.cli.cores import local_operator_token, parse_seconds, parse_time
from tests.core_broker.conftest import OPERATOR_TOKEN, running_broker


async def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_cores_actions(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cores", "--help"])
    out = capsys.readouterr().out
    for action in ("devices", "reserve", "release", "list", "watch", "capacity", "add-device"):
        assert action in out


def test_durations_times_and_the_local_operator_token():
    assert parse_seconds("90") == 90 and parse_seconds("250ms") == 0.25
    assert parse_seconds("5m") == 300 and parse_seconds("1.5h") == 5400
    assert parse_time("2030-01-01T00:00:00Z") == 1893456000
    assert local_operator_token() == "lightpath-local-operator"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cores", "devices", "--kind", "qpu"])


async def test_reserve_list_devices_watch_release_through_the_cli(redis_url, capsys, monkeypatch):
    async with running_broker(redis_url) as b:
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.setenv("LIGHTPATH_CB_OPERATOR_TOKEN", OPERATOR_TOKEN)
        monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
        code, out, _ = await cli(
            capsys, "cores", "add-device", "gpu-1", "--kind", "gpu", "--cores", "80"
        )
        assert code == 0 and "gpu-1" in out
        code, out, _ = await cli(capsys, "cores", "add-app", "cam", "--qos", "premium", "--json")
        token = json.loads(out)["token"]
        monkeypatch.setenv("LIGHTPATH_CB_TOKEN", token)

        code, out, _ = await cli(
            capsys, "cores", "reserve", "r-1", "--cores", "50", "--duration", "10m", "--json"
        )
        assert code == 0
        r = json.loads(out)
        assert r["outcome"] == "OUTCOME_GRANTED" and r["allocations"][0]["cores"] == 50
        code, out, _ = await cli(
            capsys,
            "cores",
            "reserve",
            "r-2",
            "--cores",
            "50",
            "--duration",
            "1m",
            "--accept",
            "partial",
        )
        assert code == 0 and "PARTIAL" in out and "30 cores now" in out

        code, out, _ = await cli(capsys, "cores", "devices", "--json")
        (d,) = json.loads(out)["devices"]
        assert (d["reserved_cores"], d.get("free_cores", 0)) == (80, 0)
        code, out, _ = await cli(capsys, "cores", "devices")
        assert "gpu-1" in out and "GPU" in out

        code, out, _ = await cli(capsys, "cores", "list", "--json")
        assert [x["reservation_id"] for x in json.loads(out)["reservations"]] == ["r-2", "r-1"]
        code, out, _ = await cli(capsys, "cores", "capacity", "--from", "+1s", "--to", "+2s")
        assert code == 0 and "GPU" in out

        code, out, _ = await cli(capsys, "cores", "watch", "r-1", "--count", "1", "--json")
        ev = json.loads(out.splitlines()[0])
        assert ev["type"] == "RESERVATION_EVENT_TYPE_CURRENT"

        code, out, _ = await cli(capsys, "cores", "extend", "r-1", "--by", "1m", "--json")
        assert code == 0
        code, out, _ = await cli(capsys, "cores", "release", "r-1", "--json")
        assert json.loads(out)["state"] == "RESERVATION_STATE_RELEASED"

        # a refused call is one readable line and exit code 1
        code, out, err = await cli(
            capsys, "cores", "reserve", "r-3", "--cores", "0", "--duration", "1m"
        )
        assert code == 1 and "INVALID_ARGUMENT" in err and "request.cores" in err
        monkeypatch.setenv("LIGHTPATH_CB_TOKEN", "cam:wrong")
        code, _, err = await cli(capsys, "cores", "list")
        assert code == 1 and "UNAUTHENTICATED" in err
