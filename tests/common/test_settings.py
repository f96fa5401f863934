from __future__ import annotations

import pytest

from lightpath_services.common.settings import (
    CommonSettings,
    Id,
    SettingsError,
    describe,
    load,
    setting,
)
from tests.helpers import SERVICES, settings_class


def test_defaults_are_documented_and_used():
    s = load(CommonSettings, {})
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.log_level == "info" and s.shutdown_grace_s == 5.0
    docs = {d.env: d for d in describe(CommonSettings)}
    assert docs["LIGHTPATH_REDIS_URL"].default == repr("redis://127.0.0.1:6379/0")
    assert all(d.doc for d in docs.values())


def test_values_are_parsed_by_type():
    s = load(
        CommonSettings,
        {
            "LIGHTPATH_SHUTDOWN_GRACE_S": "2.5",
            "LIGHTPATH_LOG_LEVEL": "DEBUG",
            "LIGHTPATH_LISTEN": "[::]:7000",
        },
    )
    assert s.shutdown_grace_s == 2.5 and s.log_level == "debug" and s.listen == "[::]:7000"


@pytest.mark.parametrize(
    ("var", "value", "words"),
    [
        ("LIGHTPATH_REDIS_URL", "http://x", "must start with redis://"),
        ("LIGHTPATH_LISTEN", "nohostport", "host:port"),
        ("LIGHTPATH_LISTEN", "[::]:99999", "0..65535"),
        ("LIGHTPATH_LOG_LEVEL", "loud", "one of debug, info"),
        ("LIGHTPATH_SHUTDOWN_GRACE_S", "-1", ">= 0"),
        ("LIGHTPATH_SHUTDOWN_GRACE_S", "soon", "could not convert"),
        ("OTEL_TRACES_EXPORTER", "jaeger", "one of none, console, otlp"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_rule(var, value, words):
    with pytest.raises(SettingsError) as err:
        load(CommonSettings, {var: value})
    assert var in str(err.value) and words in str(err.value)


def test_required_setting_fails_when_missing():
    class Needs(CommonSettings):
        pod: Id = setting("LIGHTPATH_TEST_POD", ..., "a pod")

    with pytest.raises(SettingsError, match="LIGHTPATH_TEST_POD is required"):
        load(Needs, {})
    with pytest.raises(SettingsError, match="LIGHTPATH_TEST_POD='a:b' is invalid"):
        load(Needs, {"LIGHTPATH_TEST_POD": "a:b"})
    assert load(Needs, {"LIGHTPATH_TEST_POD": "pod-9"}).pod == "pod-9"


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_has_its_own_default_port_and_common_settings(service):
    cls = settings_class(service)
    envs = {d.env for d in describe(cls)}
    assert {"LIGHTPATH_REDIS_URL", "LIGHTPATH_LISTEN", "LIGHTPATH_LOG_LEVEL"} <= envs
    assert load(cls, {}).listen.endswith(
        tuple(f":{p}" for p in (50051, 50061, 50062, 50063, 50081, 50091))
    )


def test_service_main_exits_2_naming_the_variable(capsys, monkeypatch):
    from lightpath_services.ocs_manager.__main__ import main

    monkeypatch.setenv("LIGHTPATH_POD_ID", "bad pod")
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert "LIGHTPATH_POD_ID='bad pod' is invalid" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("service", "var", "value", "says"),
    [
        (
            "agg_switch",
            "LIGHTPATH_AGG_CHUNK_BYTES",
            "12",
            "must be a multiple of 8 within 8..16777216",
        ),
        ("agg_switch", "LIGHTPATH_AGG_SLOTS", "0", "must be an integer within 1..1000000"),
        ("agg_switch", "LIGHTPATH_AGG_SHM_IDLE_S", "0", "must be within (0, 86400]"),
        ("cell_scheduler", "LIGHTPATH_MAX_INFLIGHT", "0", "must be an integer > 0"),
        (
            "cell_scheduler",
            "LIGHTPATH_MAX_INFLIGHT",
            "many",
            "could not convert it to an integer; must be an integer > 0",
        ),
        (
            "cell_scheduler",
            "LIGHTPATH_PLAINTEXT",
            "maybe",
            "must be one of true/false/1/0/yes/no/on/off",
        ),
        ("core_broker", "LIGHTPATH_CB_MAX_BATCH", "-3", "must be an integer > 0"),
    ],
)
def test_a_bad_value_in_the_environment_names_the_variable_value_and_rule(
    monkeypatch, service, var, value, says
):
    """Through os.environ (pydantic-settings' own source), as a service's start reads it."""
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load(settings_class(service))
    assert str(err.value) == f"{var}={value!r} is invalid: {says}"
    monkeypatch.delenv(var)
    assert load(settings_class(service)).listen  # and the default is fine again


def test_variable_names_are_exact_and_values_raw():
    """LIGHTPATH_* only in capitals (as before), a list setting is not read as JSON."""
    from lightpath_services.console.settings import ConsoleSettings

    assert load(CommonSettings, {"lightpath_log_level": "debug"}).log_level == "info"
    s = load(ConsoleSettings, {"LIGHTPATH_CONSOLE_OCS_ADDRS": "pod-1=127.0.0.1:1"})
    assert s.ocs_addrs == (("pod-1", "127.0.0.1:1"),)
