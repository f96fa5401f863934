"""Which Redis a URL names, and a client of it (one for the services, the stack and
the CLI; services reach it through lightpath_services.common.redis_store).

    redis://[user:pass@]host:port/db        one server (rediss:// with TLS)
    unix:///path/to/redis.sock?db=0         one server on a local socket
    redis+cluster://[user:pass@]h1:p1,h2:p2 a Redis Cluster, by some of its nodes
                                            (rediss+cluster:// with TLS)
    redis+sentinel://[user:pass@]h1:p1,h2:p2/service_name[/db]
                                            the master Sentinel names service_name
                                            (rediss+sentinel:// with TLS to the servers)

The user and password are the data servers' (a password in
LIGHTPATH_REDIS_PASSWORD_FILE overrides the URL's); sentinels are asked without
one. Every key Lightpath writes carries a hash tag (`{cell}`, `{pod-1}`,
`{broker}`, `{agg:tree-1}`), so each Lua script and transaction stays in one
cluster slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

SINGLE = ("redis", "rediss", "unix")
CLUSTER = ("redis+cluster", "rediss+cluster")
SENTINEL = ("redis+sentinel", "rediss+sentinel")
SCHEMES = "redis://, rediss://, unix://, redis+cluster:// or redis+sentinel://"


@dataclass(frozen=True)
class RedisTarget:
    kind: Literal["single", "cluster", "sentinel"]
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    tls: bool = False
    service_name: str = ""
    db: int = 0

    def describe(self) -> str:
        """Where, for people (no password)."""
        if self.kind == "single":
            return self.url.split("@")[-1] if "@" in self.url else self.url
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        if self.kind == "cluster":
            return f"the Redis Cluster at {hosts}"
        return f"the master {self.service_name!r} of the sentinels at {hosts}"


def parse(url: str) -> RedisTarget:
    """The target `url` names; ValueError saying what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in (*SINGLE, *CLUSTER, *SENTINEL):
        raise ValueError(f"must start with {SCHEMES}")
    if scheme in SINGLE:
        return RedisTarget("single", url, tls=scheme == "rediss")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0].strip("/")
    creds, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = creds.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    default_port = 26379 if scheme in SENTINEL else 6379
    nodes = tuple(_host_port(h, default_port) for h in hosts.split(",") if h)
    if not nodes:
        raise ValueError("names no host: give host:port[,host:port...]")
    tls = scheme.startswith("rediss")
    if scheme in CLUSTER:
        if path not in ("", "0"):
            raise ValueError("a Redis Cluster has only database 0")
        return RedisTarget("cluster", url, nodes, username, password, tls)
    service, _, db = path.partition("/")
    if not service:
        raise ValueError("names no service: redis+sentinel://h1:p1,h2:p2/service_name[/db]")
    if db and not db.isdigit():
        raise ValueError(f"database {db!r} is not a number")
    return RedisTarget("sentinel", url, nodes, username, password, tls, service, int(db or 0))


def _host_port(raw: str, default_port: int) -> tuple[str, int]:
    if raw.startswith("["):  # [v6]:port
        host, _, port = raw[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = raw.rpartition(":") if ":" in raw else (raw, "", "")
    if not host:
        raise ValueError(f"{raw!r} is not host:port")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{raw!r}: the port must be 1..65535")
    return host, int(port) if port else default_port


def client(
    url: str,
    *,
    decode_responses: bool = True,
    password: str | None = None,
    max_connections: int = 64,
    pool_timeout_s: float = 2.0,
    **connection: Any,
) -> Any:
    """An asyncio client of `url`: `redis.asyncio.Redis` (one server or the master a
    Sentinel names; a command waits up to `pool_timeout_s` for one of the
    `max_connections`) or `redis.asyncio.cluster.RedisCluster` (`max_connections`
    per node; one more fails at once with MaxConnectionsError). `connection`: retry,
    timeouts and health checks, as redis-py takes them."""
    import redis.asyncio as aioredis

    target = parse(url)
    secret = password or target.password
    if target.kind == "single":
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            **({"password": password} if password else {}),
            decode_responses=decode_responses,
            max_connections=max_connections,
            timeout=pool_timeout_s,
            **connection,
        )
        return aioredis.Redis.from_pool(pool)
    if target.kind == "cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        connection.pop("retry_on_error", None)  # the cluster client retries by its own rules
        connection.pop("health_check_interval", None)
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
            username=target.username,
            password=secret,
            ssl=target.tls,
            decode_responses=decode_responses,
            max_connections=max_connections,
            **connection,
        )
    from redis.asyncio.sentinel import Sentinel

    timeouts = {k: v for k, v in connection.items() if k.startswith("socket_")}
    sentinel = Sentinel(
        list(target.nodes),
        sentinel_kwargs={**timeouts, "decode_responses": True},
        username=target.username,
        password=secret,
        ssl=target.tls,
        decode_responses=decode_responses,
        **connection,
    )
    return sentinel.master_for(
        target.service_name,
        connection_pool_class=_sentinel_blocking_pool(),
        connection_class=_demotion_aware(target.tls),
        db=target.db,
        max_connections=max_connections,
        timeout=pool_timeout_s,
    )


def _sentinel_blocking_pool() -> type:
    """A Sentinel-managed pool that waits for a free connection (redis-py's waits for
    none: it opens one more without bound)."""
    from redis.asyncio.connection import BlockingConnectionPool
    from redis.asyncio.sentinel import SentinelConnectionPool

    class SentinelBlockingConnectionPool(SentinelConnectionPool, BlockingConnectionPool):
        pass

    return SentinelBlockingConnectionPool


# What a demoted master answers that redis-py's Sentinel connection does not take for a
# demotion: a write inside a Lua script (the script's error wraps READONLY) and WAIT.
DEMOTED = (
    "-READONLY You can't write against a read only replica",
    "WAIT cannot be used with replica",
)


def _demotion_aware(tls: bool) -> type:
    """A Sentinel-managed connection that, like redis-py's on a plain READONLY, drops
    the connection and raises ConnectionError (retried: the next connection asks the
    sentinels for the master) when a script's write or a WAIT finds a replica — else
    every script on a connection kept to a demoted master fails until it closes — and
    that moves to the master the pool last heard of before it sends (a deposed master
    still answers as one until Sentinel demotes it, ~8 s after it is back)."""
    from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
    from redis.exceptions import ConnectionError, ResponseError

    base: Any = SentinelManagedSSLConnection if tls else SentinelManagedConnection

    class DemotionAwareConnection(base):  # type: ignore[misc, valid-type]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            # The pool learnt of a new master (recheck_master): this connection, to the
            # old one, reconnects to it first instead of writing to a deposed master.
            pool = self.connection_pool
            known = pool.master_address
            if pool.is_master and self.is_connected and known not in (None, (self.host, self.port)):
                await self.disconnect()
                await self.connect()
            await super().send_packed_command(command, check_health)

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().read_response(*args, **kwargs)
            except ResponseError as exc:
                if self.connection_pool.is_master and any(d in str(exc) for d in DEMOTED):
                    await self.disconnect()
                    raise ConnectionError("the previous master is now a replica") from exc
                raise

    return DemotionAwareConnection


async def recheck_master(client: Any) -> None:
    """Behind Sentinel: ask the sentinels which server is the master; when it moved, the
    pool drops its idle connections (they reconnect to the new one). Else nothing. For
    a sign that this client's master may have been deposed (WAIT found no replica)."""
    pool: Any = getattr(client, "connection_pool", None)
    if getattr(pool, "is_master", False) and hasattr(pool, "get_master_address"):
        await pool.get_master_address()
