"""The Redis URL forms a service accepts (issue 16), and the clear refusal of others."""

from __future__ import annotations

import pytest

from lightpath.redis_url import parse
from lightpath_services.common.settings import CommonSettings, SettingsError, load


@pytest.mark.parametrize(
    ("url", "kind", "nodes", "extra"),
    [
        ("redis://127.0.0.1:6379/0", "single", (), {}),
        ("rediss://:pw@redis.example:6380/2", "single", (), {"tls": True}),
        ("unix:///run/redis.sock?db=1", "single", (), {}),
        (
            "redis+cluster://h1:7000,h2:7001,[::1]:7002",
            "cluster",
            (("h1", 7000), ("h2", 7001), ("::1", 7002)),
            {},
        ),
        (
            "rediss+cluster://lp:s%40cret@h1",
            "cluster",
            (("h1", 6379),),
            {"tls": True, "username": "lp", "password": "s@cret"},
        ),
        (
            "redis+sentinel://:pw@s1:26379,s2/mymaster/3",
            "sentinel",
            (("s1", 26379), ("s2", 26379)),
            {"service_name": "mymaster", "db": 3, "password": "pw"},
        ),
    ],
)
def test_each_url_form_names_its_target(url, kind, nodes, extra):
    target = parse(url)
    assert target.kind == kind
    if nodes:
        assert target.nodes == nodes
    for name, value in extra.items():
        assert getattr(target, name) == value
    assert "pw" not in target.describe() and "s@cret" not in target.describe()


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://h:1", "must start with redis://"),
        ("redis+cluster://", "names no host"),
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1:99999", "port must be 1..65535"),
        ("redis+sentinel://s1:26379", "names no service"),
        ("redis+sentinel://s1:26379/mymaster/x", "is not a number"),
    ],
)
def test_a_wrong_url_is_refused_at_start_naming_the_setting_and_rule(url, rule):
    with pytest.raises(SettingsError) as err:
        load(CommonSettings, {"LIGHTPATH_REDIS_URL": url})
    assert "LIGHTPATH_REDIS_URL" in str(err.value) and rule in str(err.value)


def test_commits_waiting_for_replicas_are_refused_on_a_redis_cluster():
    """WAIT counts one node's replicas (issue 32): the setting is for one server or
    Sentinel, and a cluster URL with it fails at start saying what to do instead."""
    from lightpath_services.common import redis_store

    cluster = {
        "LIGHTPATH_REDIS_URL": "redis+cluster://h1:7000",
        "LIGHTPATH_REDIS_COMMIT_REPLICAS": "1",
    }
    with pytest.raises(SettingsError, match=r"not a Redis Cluster.*min-replicas-to-write"):
        load(CommonSettings, cluster)
    with pytest.raises(SettingsError, match="LIGHTPATH_REDIS_COMMIT_REPLICAS='-1' is invalid"):
        load(CommonSettings, {"LIGHTPATH_REDIS_COMMIT_REPLICAS": "-1"})
    sentinel = load(
        CommonSettings,
        {
            "LIGHTPATH_REDIS_URL": "redis+sentinel://s1:26379/lightpath",
            "LIGHTPATH_REDIS_COMMIT_REPLICAS": "2",
            "LIGHTPATH_REDIS_COMMIT_TIMEOUT_MS": "250",
        },
    )
    from lightpath_services.common.txn import Durability, durability_of

    client = redis_store.connect_with(sentinel)  # connects lazily
    assert durability_of(client) == Durability(2, 250)
