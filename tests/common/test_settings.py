from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.settings import (
    CommonSettings,
    SettingsError,
    describe,
    load,
    parse_id,
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
    @dataclass(frozen=True)
    class Needs(CommonSettings):
        pod: str = setting("LIGHTPATH_TEST_POD", None, "a pod", parse=parse_id)

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
    from services.ocs_manager.__main__ import main

    monkeypatch.setenv("LIGHTPATH_POD_ID", "bad pod")
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert "LIGHTPATH_POD_ID='bad pod' is invalid" in capsys.readouterr().err
