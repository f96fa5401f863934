"""A slow link for fault tests and benchmarks (issue 32) where the kernel has no tc netem:
a TCP relay that holds every chunk it forwards, each way, for a fixed one-way delay,
in order. Real sockets on both sides: a client (a scheduler) dials the relay's address
and whatever it speaks (gRPC over mTLS) reaches the target (an ocs_manager) late.

    python -m lightpath.testing.relay --delay-ms 200 [--off] LISTEN=TARGET ...

LISTEN and TARGET are host:port. SIGUSR1 turns the delay on, SIGUSR2 off (chunks
already held still leave at their time, and nothing overtakes them), so a benchmark
can slow the link for a spell. It prints "ready" on stdout once every LISTEN is bound.

It is not netem, and does not model what netem can: it delays the bytes a read
returns, not packets (a TCP connect, its ACKs and retransmissions are not delayed,
only the data each side sends); every chunk gets the same delay (no jitter), nothing
is reordered, duplicated or dropped by it (loss is nftables', on a veth:
lightpath.testing.netns), and it buffers without bound (a slow reader does not push
back on the sender through it the way a TCP window would).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import select
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from lightpath.embedded_redis import stop_process

CHUNK = 64 * 1024


class Relay:
    """The routes' listeners and the delay now applied (seconds, 0 when off)."""

    def __init__(self, routes: Iterable[tuple[str, str]], delay_s: float, on: bool = True):
        self.routes = list(routes)
        self.configured_s = delay_s
        self.delay_s = delay_s if on else 0.0

    def set(self, on: bool) -> None:
        self.delay_s = self.configured_s if on else 0.0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: each chunk leaves `delay_s` after it arrived, in arrival order."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await held.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(CHUNK)
                held.put_nowait((loop.time() + self.delay_s, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    async def _serve(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, port = target.rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()  # the target refused: so does the relay
            return
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        try:
            # both directions to their end; a reset on either side ends both
            done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            for p in done:
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    p.result()
        finally:
            for p in pipes:
                p.cancel()
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()

    async def run(self) -> None:
        servers = []
        for listen, target in self.routes:
            host, port = listen.rsplit(":", 1)

            async def serve(r, w, target=target):
                await self._serve(target, r, w)

            servers.append(await asyncio.start_server(serve, host, int(port)))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.set, True)
        loop.add_signal_handler(signal.SIGUSR2, self.set, False)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        for s in servers:
            s.close()


class RelayProcess:
    """The relay as a process of its own (its timing not at the mercy of the caller's
    event loop): `start` returns once it listens; `slow(on)` toggles the delay."""

    def __init__(self, routes: dict[str, str], delay_ms: int, *, on: bool = True):
        self.routes, self.delay_ms, self.on = routes, delay_ms, on
        self.proc: subprocess.Popen | None = None

    def start(self, log: Path, timeout_s: float = 20.0) -> None:
        argv = [sys.executable, "-m", "lightpath.testing.relay", "--delay-ms", str(self.delay_ms)]
        argv += [] if self.on else ["--off"]
        argv += [f"{listen}={target}" for listen, target in self.routes.items()]
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True
            )
        assert self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if readable else ""  # "ready", or "" if it died
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"the delay relay did not start (see {log})")

    def slow(self, on: bool) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=int, required=True, help="one-way delay")
    parser.add_argument("--off", action="store_true", help="start with the delay off")
    parser.add_argument("routes", nargs="+", metavar="LISTEN=TARGET")
    args = parser.parse_args(argv)
    routes = [tuple(r.split("=", 1)) for r in args.routes]
    if any(len(r) != 2 for r in routes):
        parser.error("each route is LISTEN=TARGET (host:port=host:port)")
    relay = Relay(routes, args.delay_ms / 1000, on=not args.off)  # type: ignore[arg-type]
    asyncio.run(relay.run())


if __name__ == "__main__":
    main()
