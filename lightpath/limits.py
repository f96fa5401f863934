"""How large any field of any request may be: the one table every service checks (issue 30).

A request is bounded before it costs anything: gRPC refuses one larger than its
service's `MAX_REQUEST_BYTES` before parsing it (RESOURCE_EXHAUSTED, gRPC's own
short message); one longer than the largest its type can be within the limits
(`longest_taken`: `largest_request_bytes` and room for unknown fields) is refused
unparsed (INVALID_ARGUMENT naming `request` and that size); one with a repeated or
map field over its limit at any depth is refused unparsed too, from a walk of its
wire bytes that counts entries (`count_check`, for requests of PRESCAN_ABOVE bytes
or more: a shorter one costs less to parse); and every parsed
request goes through `check` before it is authorized work, so a field over its
limit is INVALID_ARGUMENT naming the field path and the limit (`transitions: at
most 1000 entries (got 200000)`) — a short error whatever was sent, never an echo
of the value.

Defaults, by kind of field (proto comments say where a field differs):

* a string: at most `STRING` (256) characters; an id (a field named `id` or
  `*_id`) at most `ID` (128);
* bytes: at most `BYTES` (1024);
* a repeated field: at most `REPEATED` (1024) entries; each string in one (ids,
  names, ports, mask paths) at most `ID` (128) characters;
* a map: at most `MAP` (64) entries, keys at most 256 characters, string values
  at most 256 characters.

A number is bounded by its encoding, unless `FIELDS` names it: then it is at most
that value (a fencing token: `TOKEN`).

`FIELDS` overrides a field by its full name without the `lightpath.v1.` prefix
(`JobSpec.labels`); a map's keys and string values are `<field>.key` and
`<field>.value`. Ids are checked more strictly where they are used (1-64 of
A-Z a-z 0-9 . _ -, lightpath.domain.ids). Pure: no gRPC, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from lightpath.errors import InvalidArgument

STRING = 256
ID = 128  # ids are 1-64 characters (lightpath.domain.ids), a switch batch id up to 128
BYTES = 1024
REPEATED = 1024
MAP = 64

REASON = 1024  # free text a caller gives (cancel and abort reasons, block health notes)
PATH = 1024  # a file path or path template under a data directory
BLOCKS = 65_536  # blocks of the largest pod (lightpath.domain.torus.MAX_BLOCKS)
AGG_NODES = 10_000  # nodes of the largest aggregation tree (lightpath_services.agg_switch.topology)
DIMS = 8  # dimensions of a shape, grid or position
CHUNK_BYTES = (
    16 << 20
)  # an aggregation chunk (lightpath_services.agg_switch.command.MAX_CHUNK_BYTES)
LABELS = 64
LABEL_KEY = 63
LABEL_VALUE = 256
# A fencing token (issue 32): Redis scripts compare numbers as doubles, exact up to 2^53.
TOKEN = 2**53 - 1

FIELDS: Mapping[str, int] = {
    # -- jobs (workload scheduler and cell)
    "JobSpec.labels": LABELS,
    "JobSpec.labels.key": LABEL_KEY,
    "JobSpec.labels.value": LABEL_VALUE,
    "JobSpec.node_types": 64,
    "JobSpec.node_type_counts": 64,
    "JobSpec.wrap": DIMS,
    "JobSpec.shrink_to": 16,
    "Shape.dims": DIMS,
    "Coordinate.coords": DIMS,
    "CancelJobRequest.reason": REASON,
    "CancelCellJobRequest.reason": REASON,
    "ReportBlockHealthRequest.reason": REASON,
    "ReportCellBlockHealthRequest.reason": REASON,
    # what a pod reports: a reason it was given, with its own words around it
    "JobEvent.reason": 2 * REASON,
    "ListJobsRequest.states": 16,
    "ListCellJobsRequest.states": 16,
    "google.protobuf.FieldMask.paths": 2 * LABELS,
    # -- the cell's registry (what workload schedulers report)
    "PodRegistration.node_types": 64,
    "PodCapacity.types": 64,
    "NodeTypeCapacity.preemptible_by_priority": 128,
    "ReportPodStatusRequest.transitions": 500,
    # -- tenants' quotas (issue 35): one entry per node type
    "Quota.nominal_chips": 64,
    "Quota.borrowing_limit": 64,
    "Quota.lending_limit": 64,
    "Quota.pod": ID,
    "DeleteQuotaRequest.pod": ID,
    "TenantQuota.pod": ID,
    "PodHold.pod": ID,
    "AdmitJobRequest.reclaim": 1024,
    "AdmitJobRequest.forward_token": TOKEN,
    "GetJobRequest.forward_token": TOKEN,
    # -- the OCS manager and switch agents (a caller's lease token: issue 32)
    "WireSliceRequest.lease_token": TOKEN,
    "ReleaseSliceRequest.lease_token": TOKEN,
    "ReplaceBlockRequest.lease_token": TOKEN,
    "ReserveRingsRequest.lease_token": TOKEN,
    "ReleaseRingsRequest.lease_token": TOKEN,
    "SwapGroupRequest.lease_token": TOKEN,
    "WireSliceRequest.blocks": BLOCKS,
    "WireSliceRequest.wrap": DIMS,
    "SwapGroupRequest.free_groups": BLOCKS,
    "ApplyBatchRequest.disconnect": 4096,
    "ApplyBatchRequest.set_outputs": 4096,
    "ApplyBatchRequest.connect": 4096,
    "ApplyBatchesRequest.batches": 1024,
    # -- the core broker
    "SetLatenciesRequest.latencies": 4096,
    "QueryCapacityRequest.device_ids": 10_000,
    "BatchReserveRequest.requests": 1000,
    "ReservationRequest.device_ids": 1024,
    "Dataset.path": PATH,
    "Component.params.value": PATH,
    "GraphSpec.flows": 4096,
    "ReportGraphMetricsRequest.metrics": 1,
    "GraphRunMetrics.components": 10_000,
    "GraphRunMetrics.flows": 10_000,
    "GraphRunMetrics.processes": 10_000,
    "GetGraphMetricsRequest.components": 10_000,
    # -- aggregation switches
    "AggTopology.nodes": AGG_NODES,
    "AggTopology.endpoints": AGG_NODES,
    "StartCommandRequest.participants": AGG_NODES,
    "StartCommandRequest.predicted_timeout_nodes": AGG_NODES,
    "ChooseTimeoutAggregatorRequest.participants": AGG_NODES,
    "PredictStragglersRequest.participants": AGG_NODES,
    "TimeoutAggregatorSelection.candidates": AGG_NODES,
    "AggChunk.timeout_nodes": AGG_NODES,
    "AggChunk.released": AGG_NODES,
    "AggChunk.data": CHUNK_BYTES,
    "AbortCommandRequest.reason": REASON,
    "SetParametersRequest.data": CHUNK_BYTES,
}

# gRPC's max receive size per service: its largest legal request (as
# `largest_request_bytes` counts it, every field at its limit) in whole MiB, so gRPC
# refuses a longer one by its length prefix (RESOURCE_EXHAUSTED) before reading it.
# A few requests nest repeated fields so deep that the product of their limits would
# be far larger (BatchReserve, graphs, DefineTopology, ApplyBatches): for those
# services this size is the aggregate limit, and it is still many times what a real
# one needs. Within it, a request longer than its own type takes (`longest_taken`)
# is refused before it is parsed (INVALID_ARGUMENT naming `request` and that size:
# the deserializer in lightpath_services.common.telemetry).
MiB = 1 << 20
MAX_REQUEST_BYTES: Mapping[str, int] = {
    "cell_scheduler": 5 * MiB,  # ReportPodStatus, 4.9 MB
    "workload_scheduler": 1 * MiB,  # UpdateJob, 0.24 MB
    "ocs_manager": 4 * MiB,  # WireSlice, 3.7 MB
    "core_broker": 8 * MiB,  # SetLatencies 6.4 MB; graphs and BatchReserve nest
    "agg_switch": CHUNK_BYTES + 4 * MiB,  # SetParameters, a chunk; DefineTopology nests
    "switch_agent": 16 * MiB,  # ApplyBatch 0.17 MB; ApplyBatches nests (the ocs_manager's)
}
DEFAULT_REQUEST_BYTES = 4 * MiB

_PREFIX = "lightpath.v1."
_STRING, _BYTES = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _name(field: FieldDescriptor) -> str:
    return field.full_name.removeprefix(_PREFIX)


def limit_of(name: str, default: int) -> int:
    """The limit of the field called `name` (`JobSpec.labels`, `JobSpec.labels.key`)."""
    return FIELDS.get(name, default)


@dataclass(frozen=True)
class _Rule:
    """What to check of one field: its kind, its limit, and what its items are."""

    name: str
    kind: str  # "str" "bytes" "msg" "rep" "rep_str" "rep_bytes" "rep_msg" "map" "num"
    limit: int = 0  # characters, bytes or entries; a number's largest value
    item: int = 0  # characters or bytes of each item of a repeated field
    key: int = 0  # a map's key characters (string keys)
    value: int = 0  # a map's string or bytes values
    value_msg: bool = False


_RULES: dict[str, dict[str, _Rule]] = {}


def _rule(field: FieldDescriptor) -> _Rule | None:
    name = _name(field)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f = field.message_type.fields_by_name["key"]
        value_f = field.message_type.fields_by_name["value"]
        return _Rule(
            name,
            "map",
            limit_of(name, MAP),
            key=limit_of(f"{name}.key", STRING) if key_f.type == _STRING else 0,
            value=limit_of(f"{name}.value", STRING if value_f.type == _STRING else BYTES)
            if value_f.type in (_STRING, _BYTES)
            else 0,
            value_msg=value_f.type == _MESSAGE,
        )
    if field.is_repeated:
        if field.type == _STRING:
            return _Rule(name, "rep_str", limit_of(name, REPEATED), item=ID)
        if field.type == _BYTES:
            return _Rule(name, "rep_bytes", limit_of(name, REPEATED), item=BYTES)
        if field.type == _MESSAGE:
            return _Rule(name, "rep_msg", limit_of(name, REPEATED))
        return _Rule(name, "rep", limit_of(name, REPEATED))
    if field.type == _STRING:
        is_id = field.name == "id" or field.name.endswith("_id")
        return _Rule(name, "str", limit_of(name, ID if is_id else STRING))
    if field.type == _BYTES:
        return _Rule(name, "bytes", limit_of(name, BYTES))
    if field.type == _MESSAGE:
        return _Rule(name, "msg")
    if name in FIELDS:
        return _Rule(name, "num", FIELDS[name])
    return None  # other numbers, bools and enums are bounded by their encoding


def _rules(descriptor: Any) -> dict[str, _Rule]:
    rules = _RULES.get(descriptor.full_name)
    if rules is None:
        rules = {}
        for field in descriptor.fields:
            rule = _rule(field)
            if rule is not None:
                rules[field.name] = rule
        _RULES[descriptor.full_name] = rules
    return rules


# The most bytes one value of a scalar type takes on the wire (a negative int32 or
# enum is sign-extended to ten).
_FIXED = {
    FieldDescriptor.TYPE_BOOL: 1,
    FieldDescriptor.TYPE_FIXED32: 4,
    FieldDescriptor.TYPE_SFIXED32: 4,
    FieldDescriptor.TYPE_FLOAT: 4,
    FieldDescriptor.TYPE_FIXED64: 8,
    FieldDescriptor.TYPE_SFIXED64: 8,
    FieldDescriptor.TYPE_DOUBLE: 8,
    FieldDescriptor.TYPE_UINT32: 5,
    FieldDescriptor.TYPE_SINT32: 5,
}
_UTF8 = 4  # bytes of one character, at most
_LARGEST: dict[str, int] = {}


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _framed(number: int, payload: int) -> int:
    """A length-delimited field: its tag, its length and `payload` bytes."""
    return _varint_size(number << 3) + _varint_size(payload) + payload


def largest_request_bytes(descriptor: Any) -> int:
    """The most bytes a message of `descriptor` takes encoded with every field at its
    limit (lightpath.limits' table): what a request that passes `check` can be at
    most, so one longer is refused before it is parsed (telemetry's deserializer).
    A message inside itself counts once (no legal request needs it deeper)."""
    full = descriptor.full_name
    if full not in _LARGEST:
        _LARGEST[full] = 0  # (a message met again inside itself)
        _LARGEST[full] = _largest(descriptor)
    return _LARGEST[full]


# Room beyond a type's largest for fields a newer client may send that this version
# does not know (protobuf keeps them; refusing them would break version skew).
UNKNOWN_FIELDS_BYTES = 4096


def longest_taken(descriptor: Any) -> int:
    """The longest encoded request of `descriptor` a service parses: its largest within
    the limits and room for unknown fields. A longer one is refused unparsed."""
    return largest_request_bytes(descriptor) + UNKNOWN_FIELDS_BYTES


def _scalar(field: FieldDescriptor) -> int:
    return _FIXED.get(field.type, 10)


def _largest(descriptor: Any) -> int:
    total = 0
    rules = _rules(descriptor)
    for f in descriptor.fields:
        rule = rules.get(f.name)
        tag = _varint_size(f.number << 3)
        if rule is None or rule.kind == "num":  # a single number, bool or enum
            total += tag + _scalar(f)
        elif rule.kind == "str":
            total += _framed(f.number, _UTF8 * rule.limit)
        elif rule.kind == "bytes":
            total += _framed(f.number, rule.limit)
        elif rule.kind == "msg":
            total += _framed(f.number, largest_request_bytes(f.message_type))
        elif rule.kind == "rep":  # packed numbers (or unpacked: a tag each)
            total += max(
                _framed(f.number, rule.limit * _scalar(f)), rule.limit * (tag + _scalar(f))
            )
        elif rule.kind == "rep_str":
            total += rule.limit * _framed(f.number, _UTF8 * rule.item)
        elif rule.kind == "rep_bytes":
            total += rule.limit * _framed(f.number, rule.item)
        elif rule.kind == "rep_msg":
            total += rule.limit * _framed(f.number, largest_request_bytes(f.message_type))
        else:  # a map: each entry a message of key (1) and value (2)
            key_f = f.message_type.fields_by_name["key"]
            value_f = f.message_type.fields_by_name["value"]
            key = _framed(1, _UTF8 * rule.key) if rule.key else 1 + _scalar(key_f)
            if rule.value_msg:
                value = _framed(2, largest_request_bytes(value_f.message_type))
            elif rule.value:
                unit = _UTF8 if value_f.type == _STRING else 1
                value = _framed(2, unit * rule.value)
            else:
                value = 1 + _scalar(value_f)
            total += rule.limit * _framed(f.number, key + value)
    return total


def _too_long(path: str, n: int, limit: int, unit: str) -> InvalidArgument:
    return InvalidArgument(path, f"at most {limit:,} {unit} (got {n:,})", reason="FIELD_TOO_LARGE")


def check(msg: Message, prefix: str = "") -> None:
    """Raise InvalidArgument naming the first field of `msg` over its limit (cost:
    one look at each field that is set, bounded by the service's receive size)."""
    rules = _rules(msg.DESCRIPTOR)
    for field, value in msg.ListFields():
        rule = rules.get(field.name)
        if rule is None:
            continue
        path = f"{prefix}{field.name}"
        kind = rule.kind
        if kind == "str" or kind == "bytes":
            if len(value) > rule.limit:
                raise _too_long(path, len(value), rule.limit, _unit(kind))
        elif kind == "msg":
            check(value, path + ".")
        elif kind == "num":
            if value > rule.limit:
                raise InvalidArgument(
                    path, f"at most {rule.limit:,} (got {value:,})", reason="FIELD_TOO_LARGE"
                )
        else:
            n = len(value)
            if n > rule.limit:
                raise _too_long(path, n, rule.limit, "entries")
            if kind == "rep_msg":
                for i, item in enumerate(value):
                    check(item, f"{path}[{i}].")
            elif kind in ("rep_str", "rep_bytes"):
                for i, item in enumerate(value):
                    if len(item) > rule.item:
                        raise _too_long(f"{path}[{i}]", len(item), rule.item, _unit(kind))
            elif kind == "map":
                _check_map(value, rule, path)


def _check_map(value: Mapping, rule: _Rule, path: str) -> None:
    for key in value:
        if rule.key and len(key) > rule.key:
            raise _too_long(f"{path} (a key)", len(key), rule.key, "characters")
        item = value[key]
        where = f"{path}[{key}]" if isinstance(key, str) else f"{path}[{key!r}]"
        if rule.value_msg:
            check(item, where + ".")
        elif rule.value and len(item) > rule.value:
            unit = "characters" if isinstance(item, str) else "bytes"
            raise _too_long(where, len(item), rule.value, unit)


def _unit(kind: str) -> str:
    return "bytes" if "bytes" in kind else "characters"


def clip(text: str, name: str) -> str:
    """`text` cut to the limit of the string field `name` (what a service sends on
    must fit what the next one takes)."""
    limit = limit_of(name, STRING)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def request_bytes(service: str) -> int:
    """gRPC's max receive message size for `service`."""
    return MAX_REQUEST_BYTES.get(service, DEFAULT_REQUEST_BYTES)


# Requests at least this long are pre-scanned (`count_check`) before they are parsed: a
# shorter one costs less to parse than the scan would save.
PRESCAN_ABOVE = 64 * 1024

# The bytes that continue a varint (high bit set): deleted, what is left of a packed
# field of varints is one byte per entry.
_CONTINUES = bytes(range(0x80, 0x100))
# Scalar types encoded in a fixed number of bytes (the others are varints).
_FIXED_WIRE = frozenset(
    {
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_FLOAT,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_DOUBLE,
    }
)


def varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf varint (for the few writers of wire bytes by hand)."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def read_varint(raw: bytes, i: int) -> tuple[int, int]:
    """The varint at `raw[i:]` and the index after it (IndexError past the end, or
    for one longer than 10 bytes)."""
    n = shift = 0
    while True:
        b = raw[i]
        i += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


# How deep the wire walk follows message fields (Lightpath's requests nest their
# repeated fields four deep at most); a field deeper is left to `check`.
WALK_DEPTH = 8
# Tags a message may have beyond one per field and its entries at their limits: room
# for the unknown fields a newer client sends (UNKNOWN_FIELDS_BYTES, two bytes each
# at least). Past that, the parser decides.
_SLACK_STEPS = UNKNOWN_FIELDS_BYTES // 2
# The kinds of field (a _Rule's) the walk counts, or walks into (a singular message).
# Empty entries of a flood skipped at a time: compared in one call, not walked.
_EMPTIES = 64
_WALKED = frozenset({"rep", "rep_str", "rep_bytes", "rep_msg", "map", "msg"})


class _Step(NamedTuple):
    """What the wire walk does with one field of a message."""

    name: str
    limit: int  # entries at most; 0: not counted, only walked into (a singular message)
    unit: int  # packed numbers: bytes per entry, 0 for varints; -1: not numbers
    child: _Walk | None  # the walk of each entry (a message holding counted fields)
    singular: bool  # one message: the parser merges every occurrence into it
    run_below: int  # an entry this short holds no count over its limit: skipped unread
    tag: int  # the field's tag for a length-delimited value
    empties: bytes | None  # _EMPTIES empty entries of it (one-byte tags only)


@dataclass(frozen=True, slots=True)
class _Walk:
    """The wire walk of one message type: the fields it counts or walks into."""

    steps: dict[int, _Step]
    budget: int  # the most tags a legal message of this type has (and unknown fields)
    least: int  # fewest bytes of a message of this type with a count over its limit


_WALKS: dict[str, _Walk | None] = {}


def _walk_of(descriptor: Any) -> _Walk | None:
    full = descriptor.full_name
    if full not in _WALKS:
        _WALKS[full] = _build_walk(descriptor, (full,))
    return _WALKS[full]


def _build_walk(descriptor: Any, stack: tuple[str, ...]) -> _Walk | None:
    """The walk of `descriptor`, None when nothing in it (to WALK_DEPTH) is counted.
    A message met again inside itself is not walked into again (its counts are left
    to `check`, as `largest_request_bytes` counts it once)."""
    rules = _rules(descriptor)
    steps: dict[int, _Step] = {}
    least = budget = 0
    for f in descriptor.fields:
        rule = rules.get(f.name)
        if rule is None or rule.kind not in _WALKED:
            continue
        child = None
        if rule.kind in ("msg", "rep_msg"):
            inner = f.message_type.full_name
            if inner not in stack and len(stack) < WALK_DEPTH:
                child = _build_walk(f.message_type, (*stack, inner))
        limit = 0 if rule.kind == "msg" else rule.limit
        if not limit and child is None:
            continue
        unit = -1
        if rule.kind == "rep":
            unit = _FIXED[f.type] if f.type in _FIXED_WIRE else 0
        # The fewest bytes of entries over the limit: a tag and a length before packed
        # numbers (a byte each, or their size), a tag and a length or value each else.
        over = 2 + (limit + 1) * max(unit, 1) if unit >= 0 else 2 * (limit + 1)
        fewest = [over] if limit else []
        if child is not None:
            fewest.append(2 + child.least)  # its tag, its length, what is over inside
        least = min([least, *fewest]) if least else min(fewest)
        budget += limit + 1
        below = 0x80 if child is None else min(0x80, child.least)
        tag = f.number << 3 | 2
        empties = None
        if limit and unit < 0 and tag < 0x80:
            empties = bytes([tag, 0]) * _EMPTIES
        steps[f.number] = _Step(f.name, limit, unit, child, rule.kind == "msg", below, tag, empties)
    if not steps:
        return None
    return _Walk(steps, budget + len(descriptor.fields) + _SLACK_STEPS, least)


class _Tally:
    """Entries counted so far in one message: per counted field, and per singular
    message field the tally of what its occurrences hold together (merged)."""

    __slots__ = ("counts", "parts")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.parts: dict[int, _Tally] = {}


def count_check(descriptor: Any, raw: bytes) -> InvalidArgument | None:
    """A repeated or map field of `raw` (an encoded `descriptor`), at any depth to
    WALK_DEPTH, with more entries than its limit, found by walking the wire format's
    tags without parsing: fields between are skipped by their length, an entry of a
    repeated message too short to hold a count over a limit is skipped unread, and
    each message's walk stops at its first field past its limit or past the most
    tags a legal one has (so it costs at most the limits' entries, not what was sent).
    Occurrences of one singular message are counted together, as the parser merges
    them; a map's entries are counted as sent (a key sent twice counts twice: no
    serializer does that). The error names the field's path (`spec.node_types`,
    `blocks[3].position.coords`). None when every count is within its limit or the
    bytes do not walk (the parser says what is wrong with them)."""
    walk = _walk_of(descriptor)
    if walk is None:
        return None
    try:
        return _walk(walk, raw, 0, len(raw), "", _Tally())
    except IndexError:
        return None


def _walk(
    walk: _Walk, raw: bytes, i: int, end: int, path: str, tally: _Tally
) -> InvalidArgument | None:
    steps = walk.steps
    counts = tally.counts
    budget = walk.budget
    while i < end and budget:
        budget -= 1
        key = raw[i]  # a tag, most often of one byte
        if key < 0x80:
            i += 1
        else:
            key, i = read_varint(raw, i)
        wire = key & 7
        step = steps.get(key >> 3)
        if wire == 2:
            length = raw[i]
            if length < 0x80:
                i += 1
            else:
                length, i = read_varint(raw, i)
            start, i = i, i + length
            if i > end:
                return None  # a length past its message: the parser says so
            if step is None:
                continue
            if step.unit >= 0:  # packed numbers
                if step.unit:
                    n = length // step.unit
                elif length > 10 * step.limit:  # more than the limit of any varints
                    n = length
                else:  # varints: one ends at each byte with its high bit clear
                    n = len(raw[start:i].translate(None, _CONTINUES))
            else:
                n = 1
                child = step.child
                if child is not None and (step.singular or length >= child.least):
                    if step.singular:
                        number = key >> 3
                        part = tally.parts.get(number)
                        if part is None:
                            part = tally.parts[number] = _Tally()
                        found = _walk(child, raw, start, i, f"{path}{step.name}.", part)
                    else:
                        where = f"{path}{step.name}[{counts.get(key >> 3, 0)}]."
                        found = _walk(child, raw, start, i, where, _Tally())
                    if found is not None:
                        return found
                if step.empties is not None:
                    i, n = _run(step, raw, i, end, step.limit - counts.get(key >> 3, 0))
        elif step is None:
            if wire == 0:
                _, i = read_varint(raw, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            else:
                return None  # groups: not in Lightpath's protos; left to the parser
            continue
        elif wire == 0:
            _, i = read_varint(raw, i)
            n = 1
        elif wire == 1 or wire == 5:
            i += 8 if wire == 1 else 4
            n = 1
        else:
            return None
        if step.limit:
            number = key >> 3
            total = counts[number] = counts.get(number, 0) + n
            if total > step.limit:
                return InvalidArgument(
                    path + step.name,
                    f"at most {step.limit:,} entries (got more than {step.limit:,})",
                    reason="FIELD_TOO_LARGE",
                )
    return None


def _run(step: _Step, raw: bytes, i: int, end: int, room: int) -> tuple[int, int]:
    """The usual flood: after one entry of a counted field, a run of more of it, each
    a one-byte tag and a length too short to hold a count over a limit, skipped
    without decoding (empty ones _EMPTIES at a time), up to one past `room` entries.
    The index after the run and its entries, the one before it included."""
    assert step.empties is not None
    n = 1
    tag, below, empties = step.tag, step.run_below, step.empties
    while n <= room and i + 1 < end and raw[i] == tag:
        length = raw[i + 1]
        if length >= below:
            break
        if not length and n + _EMPTIES <= room and raw.startswith(empties, i, end):
            i += 2 * _EMPTIES
            n += _EMPTIES
        else:
            i += 2 + length
            n += 1
    return i, n
