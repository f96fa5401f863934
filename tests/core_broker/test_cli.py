"""`lightpath cores ...` against a real broker (X-6: every read has --json)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lightpath.cli import build_parser, main
from lightpath.cli.cores import (
    broker_credentials,
    operator_metadata,
    parse_seconds,
    parse_time,
)
from lightpath.security.identity import Principal
from tests.core_broker.conftest import OPERATOR_TOKEN, running_broker
from tests.helpers import identity


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


def test_durations_and_times():
    assert parse_seconds("90") == 90 and parse_seconds("250ms") == 0.25
    assert parse_seconds("5m") == 300 and parse_seconds("1.5h") == 5400
    assert parse_time("2030-01-01T00:00:00Z") == 1893456000
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cores", "devices", "--kind", "qpu"])


def present(monkeypatch, who: str) -> None:
    """Make `who`'s certificate the one Credentials.default() finds (LIGHTPATH_TLS_*)."""
    files = identity(who)
    monkeypatch.setenv("LIGHTPATH_TLS_CERT", str(files.cert))
    monkeypatch.setenv("LIGHTPATH_TLS_KEY", str(files.key))


def test_which_credential_the_cli_presents(monkeypatch):
    for var in ("LIGHTPATH_CB_TOKEN", "LIGHTPATH_CB_OPERATOR_TOKEN", "LIGHTPATH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    # the operator's certificate (tests/conftest.py), nothing else
    creds = broker_credentials()
    assert creds.certificate_principal() == Principal("operator", "operator")
    assert creds.token == "" and operator_metadata() == ()
    # an application's token rides with the certificate (mTLS + token)
    creds = broker_credentials("cam:s3cret")
    assert creds.token == "cam:s3cret" and creds.tls and creds.cert
    monkeypatch.setenv("LIGHTPATH_CB_TOKEN", "cam:env")
    assert broker_credentials().token == "cam:env"
    assert broker_credentials("cam:flag").token == "cam:flag"
    # the operator's actions take no $LIGHTPATH_CB_TOKEN
    assert broker_credentials(operator=True).token == ""
    # the operator certificate wins over the operator token ...
    monkeypatch.setenv("LIGHTPATH_CB_OPERATOR_TOKEN", "op-token")
    assert broker_credentials(operator=True).token == ""
    # ... which is used when the certificate is not an operator's
    present(monkeypatch, "tenant:acme")
    assert broker_credentials(operator=True).token == "op-token"
    assert broker_credentials().token == "cam:env"
    assert operator_metadata() == (("authorization", "Bearer op-token"),)
    monkeypatch.delenv("LIGHTPATH_CB_OPERATOR_TOKEN")
    creds = broker_credentials(operator=True)
    assert creds.token == "" and creds.certificate_principal() == Principal("tenant", "acme")
    assert operator_metadata() == ()


async def test_reserve_list_devices_watch_release_through_the_cli(redis_url, capsys, monkeypatch):
    # no operator token anywhere: the operator's certificate does the operator's actions
    async with running_broker(redis_url, LIGHTPATH_CB_OPERATOR_TOKEN="") as b:
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.delenv("LIGHTPATH_CB_OPERATOR_TOKEN", raising=False)
        monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
        code, out, _ = await cli(
            capsys, "cores", "add-device", "gpu-1", "--kind", "gpu", "--cores", "80"
        )
        assert code == 0 and "device gpu-1: GPU with 80 cores" in out
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
        assert (d["reserved_cores"], d["free_cores"]) == (80, 0)  # zeros are printed too
        code, out, _ = await cli(capsys, "cores", "devices")
        assert "gpu-1" in out and "GPU" in out
        code, out, _ = await cli(capsys, "cores", "devices", "-o", "name")
        assert out.split() == ["gpu-1"]
        code, out, _ = await cli(capsys, "cores", "devices", "--no-headers", "-o", "wide")
        assert out.startswith("gpu-1")

        code, out, _ = await cli(capsys, "cores", "list", "--json")
        assert [x["reservation_id"] for x in json.loads(out)["reservations"]] == ["r-2", "r-1"]
        code, out, _ = await cli(capsys, "cores", "capacity", "--from", "+1s", "--to", "+2s")
        assert code == 0 and "GPU" in out

        code, out, _ = await cli(capsys, "cores", "watch", "r-1", "--count", "1", "--json")
        ev = json.loads(out.splitlines()[0])
        assert ev["type"] == "RESERVATION_EVENT_TYPE_CURRENT"

        code, out, _ = await cli(capsys, "cores", "extend", "r-1", "--by", "1m", "--json")
        assert code == 0 and "for 11 min" in json.loads(out)["summary"]
        # the text says the window as it is after the extension, not as first decided
        code, out, _ = await cli(capsys, "cores", "extend", "r-1", "--by", "1m")
        assert code == 0 and "50 cores now for 12 min (on 1 device)" in out, out
        assert "for 10 min" not in out
        code, out, _ = await cli(capsys, "cores", "release", "r-1", "--json")
        assert json.loads(out)["state"] == "RESERVATION_STATE_RELEASED"

        # a refused call is one readable line and exit code 1
        code, out, err = await cli(
            capsys, "cores", "reserve", "r-3", "--cores", "0", "--duration", "1m"
        )
        assert code == 1 and "INVALID_ARGUMENT" in err and "request.cores" in err
        # the operator's actions ignore $LIGHTPATH_CB_TOKEN (an application's)
        code, out, _ = await cli(capsys, "cores", "add-app", "cam-2", "--json")
        assert code == 0 and json.loads(out)["token"].startswith("cam-2:")
        # --token names the caller over any certificate
        code, _, err = await cli(capsys, "cores", "add-app", "cam-3", "--token", token)
        assert code == 1 and "PERMISSION_DENIED" in err and "needs the role operator" in err
        monkeypatch.setenv("LIGHTPATH_CB_TOKEN", "cam:wrong")
        code, _, err = await cli(capsys, "cores", "list")
        assert code == 1 and "UNAUTHENTICATED" in err


async def test_the_operator_token_serves_a_caller_without_an_operator_certificate(
    redis_url, capsys, monkeypatch
):
    async with running_broker(redis_url) as b:
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
        monkeypatch.delenv("LIGHTPATH_CB_OPERATOR_TOKEN", raising=False)
        present(monkeypatch, "tenant:acme")
        argv = ("cores", "add-device", "gpu-1", "--kind", "gpu", "--cores", "8")
        code, _, err = await cli(capsys, *argv)
        assert code == 1 and "PERMISSION_DENIED" in err
        assert "tenant:acme may not call RegisterDevice" in err
        monkeypatch.setenv("LIGHTPATH_CB_OPERATOR_TOKEN", OPERATOR_TOKEN)
        code, out, _ = await cli(capsys, *argv)
        assert code == 0 and "gpu-1" in out
        code, out, _ = await cli(capsys, "cores", "devices", "--json")
        assert [d["device"]["device_id"] for d in json.loads(out)["devices"]] == ["gpu-1"]


async def test_an_application_certificate_works_through_the_cli(redis_url, capsys, monkeypatch):
    async with running_broker(redis_url) as b:
        await b.device("gpu-1", 8)
        await b.app("cam")
        monkeypatch.setenv("LIGHTPATH_CORE_BROKER_ADDR", b.address)
        monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
        monkeypatch.delenv("LIGHTPATH_CB_OPERATOR_TOKEN", raising=False)
        present(monkeypatch, "application:cam")
        code, out, _ = await cli(
            capsys, "cores", "reserve", "r-1", "--cores", "2", "--duration", "1m", "--json"
        )
        assert code == 0 and json.loads(out)["application_id"] == "cam"
