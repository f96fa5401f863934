"""AggChunk on the wire, without copying the payload more than needed (AG-14).

An AggChunk is ordinary protobuf, but its `data` (field 15) is the bulk of
it. `encode` serializes the small header with protobuf and appends the data
field by hand (one copy of the payload); `decode` finds the data field in the
received bytes and returns a zero-copy view of it, parsing only the header
with protobuf. Any protobuf client reads and writes the same bytes.

The data-path methods use these as their gRPC (de)serializers, so the
switches and the SDK pass bytes straight to grpc and can send one encoded
result to many receivers.

Between peers that share memory (`lightpath.aggregation.shm`) the same header goes
with `shm` (a ShmRef: where the elements are) instead of `data`
(`encode_ref`); RELEASE messages (`encode_release`) hand such buffers back.
The peers' offers (ShmHello) travel in ResultsRequest.shm and in the
`lightpath-shm-bin` metadata (`hello_metadata`, `hello_from_metadata`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from lightpath.aggregation.maths import DType, Kind, Packet
from lightpath.aggregation.shm import Hello
from lightpath.limits import read_varint, varint
from lightpath.v1 import agg_switch_pb2 as pb

if TYPE_CHECKING:
    import numpy as np

SERVICE = "lightpath.v1.AggSwitch"
CONTRIBUTE = f"/{SERVICE}/Contribute"
RESULTS = f"/{SERVICE}/Results"
RELAY = f"/{SERVICE}/Relay"
FROM_METADATA = "lightpath-from"
SHM_METADATA = "lightpath-shm-bin"
RELEASE = int(pb.AGG_CHUNK_KIND_RELEASE)

DATA_FIELD = 15
_DATA_KEY = bytes([(DATA_FIELD << 3) | 2])

DTYPE_TO_PB = {
    DType.INT32: pb.AGG_DTYPE_INT32,
    DType.INT64: pb.AGG_DTYPE_INT64,
    DType.FLOAT32: pb.AGG_DTYPE_FLOAT32,
    DType.FLOAT64: pb.AGG_DTYPE_FLOAT64,
    DType.BOOL: pb.AGG_DTYPE_BOOL,
}
PB_TO_DTYPE: dict[int, DType] = {int(v): k for k, v in DTYPE_TO_PB.items()}


class WireError(ValueError):
    """Bytes that are not an AggChunk."""


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    try:
        return read_varint(buf, pos)
    except IndexError:
        raise WireError("truncated varint") from None


def split(raw: bytes) -> tuple[bytes, memoryview | None]:
    """(the message without field 15, a view of field 15's bytes or None)."""
    pos, n = 0, len(raw)
    data: memoryview | None = None
    head: list[bytes] = []
    kept_from = 0
    while pos < n:
        start = pos
        key, pos = _read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            size, pos = _read_varint(raw, pos)
            if key >> 3 == DATA_FIELD:
                data = memoryview(raw)[pos : pos + size]
                head.append(raw[kept_from:start])
                kept_from = pos + size
            pos += size
        elif wire == 5:
            pos += 4
        else:
            raise WireError(f"wire type {wire} at byte {start}")
        if pos > n:
            raise WireError("truncated field")
    if not head:
        return raw, None
    head.append(raw[kept_from:])
    return b"".join(head), data


def encode_header(header: pb.AggChunk, data: np.ndarray | None) -> bytes:
    import numpy as np

    head = header.SerializeToString()
    if data is None:
        return head
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    view = memoryview(data).cast("B")  # type: ignore[arg-type]
    return b"".join((head, _DATA_KEY, varint(view.nbytes), view))


def _header(pkt: Packet, dtype: DType) -> pb.AggChunk:
    return pb.AggChunk(
        command_id=pkt.command_id,
        index=pkt.chunk,
        kind=pb.AggChunkKind.ValueType(int(pkt.kind)),
        source=pkt.source,
        destination=pkt.destination,
        timeout_nodes=pkt.timeout_nodes,
        timeout_flag=pkt.timeout_flag,
        dtype=DTYPE_TO_PB[dtype],
        fixed_point=pkt.fixed_point,
        empty=pkt.data is None,
        parameters=pkt.parameters,
    )


def encode(pkt: Packet, dtype: DType) -> bytes:
    """The packet's bytes (cached on the packet: a result sent to many nodes is encoded once)."""
    if pkt.raw is None:
        pkt.raw = encode_header(_header(pkt, dtype), pkt.data)
    return pkt.raw


def encode_ref(pkt: Packet, dtype: DType, segment: str, offset: int) -> bytes:
    """The packet with its elements named in shared memory rather than carried (cached)."""
    if pkt.raw_ref is None:
        assert pkt.data is not None
        header = _header(pkt, dtype)
        header.shm.CopyFrom(pb.ShmRef(segment=segment, offset=offset, nbytes=pkt.data.nbytes))
        pkt.raw_ref = header.SerializeToString()
    return pkt.raw_ref


def encode_release(command_id: str, chunks: list[int], source: str) -> bytes:
    """`source` is done with the RESULT buffers of `chunks` it was sent by reference."""
    return pb.AggChunk(
        command_id=command_id,
        index=chunks[0],
        kind=pb.AGG_CHUNK_KIND_RELEASE,
        source=source,
        released=chunks if len(chunks) > 1 else (),
    ).SerializeToString()


def released_chunks(header: pb.AggChunk) -> list[int]:
    """The chunks a RELEASE hands back."""
    return list(header.released) or [header.index]


def decode(raw: bytes) -> tuple[pb.AggChunk, memoryview | None]:
    head, data = split(raw)
    try:
        header = pb.AggChunk.FromString(head)
    except Exception as exc:  # protobuf's DecodeError
        raise WireError(f"not an AggChunk: {exc}") from None
    return header, data


def to_packet(header: pb.AggChunk, data: memoryview | None, raw: bytes | None) -> Packet:
    """The domain packet (data as a read-only numpy view of the received bytes, or
    of the shared memory `header.shm` names, which the caller resolved).

    The caller has checked `header.dtype` and the data length."""
    import numpy as np

    arr: np.ndarray | None = None
    by_ref = header.HasField("shm")
    if data is not None and not header.empty:
        dt = np.dtype("<i8") if header.fixed_point else PB_TO_DTYPE[header.dtype].numpy
        arr = np.frombuffer(data, dtype=dt)
    try:
        kind = Kind(header.kind)
    except ValueError:
        raise WireError(f"unknown chunk kind {header.kind}") from None
    return Packet(
        command_id=header.command_id,
        chunk=header.index,
        kind=kind,
        source=header.source,
        data=arr,
        destination=header.destination,
        timeout_nodes=tuple(header.timeout_nodes),
        timeout_flag=header.timeout_flag,
        fixed_point=header.fixed_point,
        parameters=header.parameters,
        raw=None if by_ref else raw,
        raw_ref=raw if by_ref else None,
    )


def hello_to_pb(hello: Hello) -> pb.ShmHello:
    return pb.ShmHello(
        host=hello.host, probe=hello.probe, token=hello.token, min_bytes=hello.min_bytes
    )


def hello_from_pb(msg: pb.ShmHello) -> Hello | None:
    if not msg.host:
        return None
    return Hello(msg.host, msg.probe, msg.token, msg.min_bytes)


def hello_metadata(hello: Hello | None) -> tuple[tuple[str, bytes], ...]:
    """`lightpath-shm-bin` metadata offering `hello` (none when None)."""
    if hello is None:
        return ()
    return ((SHM_METADATA, hello_to_pb(hello).SerializeToString()),)


def hello_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Hello | None:
    for key, value in metadata or ():
        if key == SHM_METADATA and isinstance(value, bytes):
            try:
                return hello_from_pb(pb.ShmHello.FromString(value))
            except Exception:  # protobuf's DecodeError: not an offer
                return None
    return None


def identity(b: bytes) -> bytes:
    return b
