"""kv_lookup: a value fetched from a Redis server per record (an external
service, so it expands into a request half and a response half, GF-5).

The halves share a `_LookupSession` (connections, requests in flight); the
response half is a root fed by the service's answers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from lightpath.graph.components.base import (
    Blip,
    Component,
    ComponentError,
    Emit,
    Record,
    ReturnCode,
    Source,
)


class _LookupSession:
    """What the two halves of a kv_lookup share: connections and requests in flight."""

    def __init__(self, params: Mapping[str, str]):
        import redis

        url = params.get("redis_url")
        if not url:
            raise ComponentError('parameter "redis_url" is required')
        kwargs = redis.connection.parse_url(url)
        self.connections = [
            redis.Connection(**kwargs) for _ in range(max(1, int(params.get("connections", "4"))))
        ]
        try:
            for c in self.connections:
                c.connect()
        except redis.RedisError as exc:
            raise ComponentError(f"cannot reach {url}: {exc}") from exc
        self.key_field = params.get("key_field", "id")
        self.key_prefix = params.get("key_prefix", "")
        self.into = params.get("into", "value")
        self.missing = params.get("missing", "")
        self.ordered = params.get("ordered", "true") == "true"
        # Per connection: the requests sent, oldest first (sequence number, record).
        self.in_flight: list[deque[tuple[int, Record]]] = [deque() for _ in self.connections]
        self.outbox: list[list[bytes]] = [[] for _ in self.connections]
        self.unsent: list[list[tuple[int, Record]]] = [[] for _ in self.connections]
        self.next_seq = 0
        self.next_out = 0
        self.done_early: dict[int, Record] = {}
        self.closed = False
        self.pending = 0
        self._rr = 0

    def request(self, record: Record) -> None:
        i = self._rr
        self._rr = (i + 1) % len(self.connections)
        try:
            key = self.key_prefix + record[self.key_field]
        except KeyError as exc:
            raise ComponentError(f"record has no field {exc}") from None
        self.outbox[i].extend(self.connections[i].pack_command("GET", key))
        self.unsent[i].append((self.next_seq, record))
        self.next_seq += 1
        self.pending += 1
        if len(self.unsent[i]) >= 128:
            self.send(i)

    def send(self, i: int) -> None:
        if self.unsent[i]:
            self.connections[i].send_packed_command(self.outbox[i], check_health=False)
            self.in_flight[i].extend(self.unsent[i])
            self.outbox[i] = []
            self.unsent[i] = []

    def send_all(self) -> None:
        for i in range(len(self.connections)):
            self.send(i)

    def receive(self, i: int, emit: Emit) -> None:
        """Read one answer on connection i and emit its record (in input order if ordered)."""
        value = self.connections[i].read_response()
        seq, record = self.in_flight[i].popleft()
        out = dict(record)
        out[self.into] = value.decode() if isinstance(value, bytes) else self.missing
        self.pending -= 1
        if not self.ordered:
            emit(out)
            return
        self.done_early[seq] = out
        while self.next_out in self.done_early:
            emit(self.done_early.pop(self.next_out))
            self.next_out += 1

    def drain(self, emit: Emit) -> None:
        self.send_all()
        for i, q in enumerate(self.in_flight):
            while q:
                self.receive(i, emit)

    def close(self) -> None:
        for c in self.connections:
            c.disconnect()


class _Responses(Source):
    def __init__(self, half: KvLookupResponse, session: _LookupSession):
        super().__init__()
        self.half = half
        self.session = session
        self.owner = half.id
        self.feeds = frozenset({half.id})

    def filenos(self) -> Sequence[int]:
        out: list[int] = []
        for c, q in zip(self.session.connections, self.session.in_flight, strict=True):
            sock = c._sock
            if q and sock is not None:
                out.append(sock.fileno())
        return out

    @property
    def ready(self) -> bool:
        return self.session.closed and self.session.pending == 0

    def compute(self) -> ReturnCode:
        s = self.session
        if s.closed and s.pending == 0:
            return ReturnCode.REACHED_EOF
        if s.closed:
            s.drain(self.half.emit)
            return ReturnCode.KEEP_GOING
        for i, (c, q) in enumerate(zip(s.connections, s.in_flight, strict=True)):
            while q and c.can_read(timeout=0):
                s.receive(i, self.half.emit)
        return ReturnCode.KEEP_GOING


class KvLookupRequest(Component):
    """kv_lookup, request half: sends GET <key_prefix><key_field> for each record,
    pipelined over a pool of connections; the answers come back to the response
    half, another root of the same folded set (GF-5, seed §2.2.3)."""

    response: KvLookupResponse

    def pair(self, other: Component) -> None:
        assert isinstance(other, KvLookupResponse)
        self.response = other
        other.request = self

    def start(self) -> None:
        self.session = _LookupSession(self.params)

    def compute(self, port: str, record: Record) -> None:
        self.session.request(record)

    def flush(self) -> None:
        self.session.send_all()

    def process_blip(self, blip: Blip) -> None:
        # Every answer to a record before the blip goes downstream before the blip.
        self.session.drain(self.response.emit)

    def shutdown(self) -> None:
        self.session.send_all()
        self.session.closed = True

    def close(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.close()


class KvLookupResponse(Component):
    """kv_lookup, response half: a root fed by the service's answers."""

    request: KvLookupRequest

    def start(self) -> None:
        self.emit = self.outputs["out"]

    def sources(self) -> Sequence[Source]:
        return (_Responses(self, self.request.session),)
