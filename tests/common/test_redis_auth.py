"""Redis with a password (requirepass), as the local stack and the compose file run it:
the pip-installed redis-server, a password from a file or from the URL. (The shipped
redis-server 6.2 is built without TLS, so `rediss://` is not exercised here; the URL
form is accepted and passed to redis-py unchanged.)"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from lightpath.client import channel, service_stub
from lightpath.embedded_redis import EmbeddedRedis
from lightpath.v1 import common_pb2
from lightpath_services.common.errors import Unavailable
from lightpath_services.common.settings import SettingsError
from tests.helpers import serve

PASSWORD = "s3cret with spaces/and:colons"


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    server = EmbeddedRedis(
        tmp_path_factory.mktemp("redis-auth"), appendonly=False, password=PASSWORD
    )
    server.start()
    yield server
    server.stop()


async def test_a_service_reaches_redis_with_the_password_from_a_file(locked_redis, tmp_path):
    secret = tmp_path / "redis.password"
    secret.write_text(PASSWORD + "\n")
    env = {"LIGHTPATH_REDIS_PASSWORD_FILE": str(secret)}
    async with serve("cell_scheduler", locked_redis.url, env) as svc, channel(svc.address) as ch:
        info = await service_stub("cell_scheduler", ch).GetInfo(common_pb2.GetInfoRequest())
        assert info.service == "lightpath.v1.CellScheduler"
        assert await svc.runtime.redis.ping()


async def test_a_password_in_the_url_works_too(locked_redis):
    url = f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{locked_redis.port}/0"
    async with serve("core_broker", url) as svc:
        assert await svc.runtime.redis.ping()


async def test_without_the_password_the_service_says_so_at_start(locked_redis, tmp_path):
    with pytest.raises(Unavailable) as err:
        async with serve("cell_scheduler", locked_redis.url):
            pass
    assert "LIGHTPATH_REDIS_PASSWORD_FILE" in str(err.value)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it")
    with pytest.raises(Unavailable) as err:
        async with serve(
            "cell_scheduler", locked_redis.url, {"LIGHTPATH_REDIS_PASSWORD_FILE": str(wrong)}
        ):
            pass
    assert "refused" in str(err.value)


def test_redis_url_schemes_are_checked():
    from lightpath_services.common.settings import CommonSettings, load

    assert load(CommonSettings, {"LIGHTPATH_REDIS_URL": "rediss://:pw@redis:6380/0"}).redis_url
    with pytest.raises(SettingsError, match="LIGHTPATH_REDIS_URL"):
        load(CommonSettings, {"LIGHTPATH_REDIS_URL": "http://redis"})
