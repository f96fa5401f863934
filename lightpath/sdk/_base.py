"""What every SDK client shares: where the service is, the channel, deadlines, retries,
typed errors, paging; and the blocking (sync) form of an async client.

Retries: the channel (lightpath.client.channel) retries UNAVAILABLE only, up to
`max_attempts` with exponential backoff; every method the SDK offers is safe to
repeat (reads, or mutations keyed by a client-chosen id: a job id, a reservation
id), so no call is ever done twice. RESOURCE_EXHAUSTED is raised, not retried.

Sync clients run their async client on a private event loop in a daemon thread
(`_LoopThread`): one implementation of every method, the channel's interceptors
(deadlines, tracing, bearer token) shared, and a sync client usable from any
thread, also from inside someone else's running event loop.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import grpc

from lightpath.client import DEFAULT_TIMEOUT_S, channel, rpc_error
from lightpath.errors import LightpathError
from lightpath.security.credentials import Credentials

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A", bound="AsyncClient")


class AsyncClient:
    """A channel to one Lightpath service. `address` (host:port) defaults to
    $`ADDR_ENV`, else the running local stack's, else the stack's default port;
    `credentials` to `Credentials.default()` (the local stack's operator certificate,
    or LIGHTPATH_TLS_* / LIGHTPATH_TOKEN*). `timeout` is every call's deadline in
    seconds (streams: none); UNAVAILABLE is retried up to `max_attempts` times."""

    PROCESS = ""  # the local stack's process name, e.g. "cell-scheduler"
    ADDR_ENV = ""  # the setting naming its address, e.g. "LIGHTPATH_CELL_ADDR"
    STUB: Any = None  # the generated stub class

    def __init__(
        self,
        address: str | None = None,
        *,
        credentials: Credentials | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_attempts: int = 5,
    ):
        from lightpath.stack import located

        if address:
            self.address, self.address_source = address, "the address given"
        else:
            self.address, self.address_source = located(self.PROCESS, self.ADDR_ENV)
        self.timeout = timeout
        self.credentials = Credentials.default() if credentials is None else credentials
        self._channel = channel(
            self.address,
            credentials=self.credentials,
            default_timeout=timeout,
            max_attempts=max_attempts,
        )
        self.stub = self.STUB(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self: A) -> A:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _error(self, err: grpc.aio.AioRpcError) -> LightpathError:
        exc = rpc_error(err)
        exc.address, exc.address_source = self.address, self.address_source
        exc.process = self.PROCESS
        return exc

    async def _call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """One unary call with a deadline; a failure raised as its lightpath.errors class."""
        try:
            return await getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err

    async def _stream(self, method: str, request: Any) -> AsyncIterator[Any]:
        """A server stream's messages; a failure raised as its lightpath.errors class.
        Leaving the loop early cancels the call."""
        call = getattr(self.stub, method)(request, timeout=None)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err
        finally:
            call.cancel()

    async def _pages(
        self,
        method: str,
        make: Callable[[str], Any],
        items: Callable[[Any], Any],
        limit: int | None,
    ) -> AsyncIterator[Any]:
        """Every item of a paginated list, page after page (`make(page_token)` builds the
        request), at most `limit`."""
        token, n = "", 0
        while True:
            page = await self._call(method, make(token))
            for item in items(page):
                if limit is not None and n >= limit:
                    return
                yield item
                n += 1
            token = page.next_page_token
            if not token:
                return


class _LoopThread:
    """A private event loop in a daemon thread; `run` a coroutine on it and wait."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="lightpath-sdk", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async iterator, fetched one at a time on the loop; leaving the
        loop early (break, an exception, garbage collection) closes it there."""

        async def next_item() -> T:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self.run(next_item())
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and self.loop.is_running():
                self.run(aclose())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class SyncClient(Generic[A]):
    """The blocking form of an async client: the same arguments, its methods made
    blocking by `blocking` and `blocking_iter`. Use `with` or call `close()`."""

    ASYNC: type[A]

    def __init__(self, *args: Any, **kwargs: Any):
        self._loop = _LoopThread()

        async def make() -> A:
            return self.ASYNC(*args, **kwargs)

        try:
            self.aio: A = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise

    @property
    def address(self) -> str:
        return self.aio.address

    def close(self) -> None:
        if self._loop.loop.is_running():
            self._loop.run(self.aio.close())
            self._loop.stop()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def blocking(
    method: Callable[Concatenate[A, P], Awaitable[R]],
) -> Callable[Concatenate[SyncClient[A], P], R]:
    """`method` of the async client, run to its end on the sync client's loop."""

    @functools.wraps(method)
    def call(self: SyncClient[A], *args: P.args, **kwargs: P.kwargs) -> R:
        async def run() -> R:
            return await method(self.aio, *args, **kwargs)

        return self._loop.run(run())

    return call


def blocking_iter(
    method: Callable[Concatenate[A, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncClient[A], P], Iterator[T]]:
    """An async-iterator `method` of the async client as a plain iterator."""

    @functools.wraps(method)
    def call(self: SyncClient[A], *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._loop.iterate(method(self.aio, *args, **kwargs))

    return call
