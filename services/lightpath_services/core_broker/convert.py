"""Protobuf <-> domain for the core broker: requests in (with the X-3 checks a
message can fail on its own), reservations and devices out."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.errors import FieldViolation, InvalidArgument, PermissionDenied
from lightpath.v1 import common_pb2, core_broker_pb2
from lightpath_services.common import validate
from lightpath_services.common.keys import ID_RULE, is_valid_id
from lightpath_services.core_broker.auth import Principal
from lightpath_services.core_broker.capacity import DEVICE_KINDS, Allocation, Device
from lightpath_services.core_broker.decisions import (
    LESSER_OUTCOMES,
    QOS_LEVELS,
    CoreRequest,
    Outcome,
    Placement,
    summary_of,
)

pb = core_broker_pb2
MAX_DEVICE_CORES = 1 << 20
T = TypeVar("T")


def timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMilliseconds(int(ms))
    return ts


def _checked(bad: list[FieldViolation], check: Callable[..., T], *args: Any) -> T | None:
    """`check(*args)`, or None with its violations added to `bad`."""
    try:
        return check(*args)
    except InvalidArgument as err:
        bad.extend(err.violations)
        return None


def kind_name(value: int) -> str:
    """DEVICE_KIND_GPU -> "GPU"; "" for UNSPECIFIED; raises ValueError for an unknown number."""
    if value == 0:
        return ""
    return pb.DeviceKind.Name(value).removeprefix("DEVICE_KIND_")  # type: ignore[arg-type]


def kind_value(name: str) -> int:
    return pb.DeviceKind.Value("DEVICE_KIND_" + name) if name else 0  # type: ignore[return-value]


def _enum_name(enum: Any, prefix: str, value: int) -> str | None:
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        return None


def core_request(
    m: core_broker_pb2.ReservationRequest, principal: Principal, prefix: str
) -> CoreRequest:
    """A ReservationRequest as the decision function takes it (CB-3). QoS and
    billing default to the application's agreement; claiming a QoS level above
    it is PERMISSION_DENIED."""
    bad: list[FieldViolation] = []

    def f(name: str) -> str:
        return f"{prefix}.{name}"

    if not is_valid_id(m.reservation_id):
        bad.append(FieldViolation(f("reservation_id"), ID_RULE))
    duration_ms = _checked(bad, validate.duration_ms, m.duration, f("duration")) or 0
    earliest = latest = None
    if m.HasField("window"):
        earliest = _checked(
            bad,
            validate.timestamp_ms,
            validate.present(m.window, "earliest_start"),
            f("window.earliest_start"),
        )
        latest = _checked(
            bad,
            validate.timestamp_ms,
            validate.present(m.window, "latest_end"),
            f("window.latest_end"),
        )
        if earliest is not None and latest is not None and latest <= earliest:
            bad.append(FieldViolation(f("window.latest_end"), "must be after earliest_start"))
    if m.task_type and not is_valid_id(m.task_type):
        bad.append(FieldViolation(f("task_type"), ID_RULE))
    qos, billing = (
        agreed if value == 0 else _enum_name(enum, prefix, value)
        for agreed, value, enum, prefix in (
            (principal.qos_level, m.qos_level, pb.QosLevel, "QOS_LEVEL_"),
            (principal.billing_model, m.billing_model, pb.BillingModel, "BILLING_MODEL_"),
        )
    )
    if qos is None:
        bad.append(FieldViolation(f("qos_level"), "unknown QoS level"))
    if billing is None:
        bad.append(FieldViolation(f("billing_model"), "unknown billing model"))
    placement: Placement | None = None
    if m.placement != 0:
        name = _enum_name(pb.PlacementPolicy, "PLACEMENT_POLICY_", m.placement)
        if name is None:
            bad.append(FieldViolation(f("placement"), "unknown placement policy"))
        else:
            placement = Placement(name)
    accept = LESSER_OUTCOMES
    if len(m.accept):
        chosen = set()
        for i, value in enumerate(m.accept):
            name = _enum_name(pb.Outcome, "OUTCOME_", value)
            if name not in {"GRANTED", "PARTIAL", "DEFERRED"}:
                bad.append(
                    FieldViolation(f(f"accept[{i}]"), "must be GRANTED, PARTIAL or DEFERRED")
                )
            else:
                chosen.add(Outcome(name))
        accept = frozenset(chosen - {Outcome.GRANTED})
    kind = ""
    if m.device_kind != 0:
        kind = _enum_name(pb.DeviceKind, "DEVICE_KIND_", m.device_kind) or "?"
        if kind == "?":
            bad.append(FieldViolation(f("device_kind"), "unknown device kind"))
    for i, device_id in enumerate(m.device_ids):
        if not is_valid_id(device_id):
            bad.append(FieldViolation(f(f"device_ids[{i}]"), ID_RULE))
    location = None
    site = ""
    if m.HasField("client_location"):
        loc = m.client_location
        if loc.site and not is_valid_id(loc.site):
            bad.append(FieldViolation(f("client_location.site"), ID_RULE))
        if not (math.isfinite(loc.x_km) and math.isfinite(loc.y_km)):
            bad.append(FieldViolation(f("client_location"), "coordinates must be finite"))
        site = loc.site
        location = (loc.x_km, loc.y_km)
    if bad:
        raise InvalidArgument.of(bad)
    assert qos is not None and billing is not None
    if (
        principal.qos_level in QOS_LEVELS
        and qos in QOS_LEVELS
        and QOS_LEVELS.index(qos) > QOS_LEVELS.index(principal.qos_level)
    ):
        raise PermissionDenied(
            f"{f('qos_level')}: {qos} is above the level agreed for application "
            f"{principal.name} ({principal.qos_level})",
            reason="QOS_ABOVE_AGREEMENT",
        )
    return CoreRequest(
        reservation_id=m.reservation_id,
        cores=m.cores,
        duration_ms=duration_ms,
        earliest_start=earliest,
        latest_end=latest,
        task_type=m.task_type,
        priority_hint=m.priority_hint or 50,
        qos_level=qos,
        billing_model=billing,
        site=site,
        location=location,
        placement=placement,
        accept=accept,
        device_kind=kind,
        device_ids=tuple(m.device_ids),
        application_id=principal.application_id or "",
    )


def agreement_in(m: core_broker_pb2.RegisterApplicationRequest) -> tuple[str, str]:
    """(QoS level, billing model) agreed with an application (CB-2); defaults
    STANDARD and ON_DEMAND."""
    qos = _enum_name(pb.QosLevel, "QOS_LEVEL_", m.qos_level or pb.QOS_LEVEL_STANDARD)
    billing = _enum_name(
        pb.BillingModel, "BILLING_MODEL_", m.billing_model or pb.BILLING_MODEL_ON_DEMAND
    )
    bad = []
    if qos is None:
        bad.append(FieldViolation("qos_level", "unknown QoS level"))
    if billing is None:
        bad.append(FieldViolation("billing_model", "unknown billing model"))
    if bad:
        raise InvalidArgument.of(bad)
    assert qos is not None and billing is not None
    return qos, billing


def stored_request(m: core_broker_pb2.ReservationRequest) -> str:
    """The request as kept with its reservation (and fingerprinted for retries):
    its deterministic serialization, base64."""
    return base64.b64encode(m.SerializeToString(deterministic=True)).decode()


def device_in(m: core_broker_pb2.Device, field: str = "device") -> Device:
    bad: list[FieldViolation] = []
    if not is_valid_id(m.device_id):
        bad.append(FieldViolation(f"{field}.device_id", ID_RULE))
    kind = _enum_name(pb.DeviceKind, "DEVICE_KIND_", m.kind) if m.kind else None
    if kind not in DEVICE_KINDS:
        bad.append(FieldViolation(f"{field}.kind", "must be one of " + ", ".join(DEVICE_KINDS)))
    if not 1 <= m.cores <= MAX_DEVICE_CORES:
        bad.append(FieldViolation(f"{field}.cores", f"must lie in 1..{MAX_DEVICE_CORES}"))
    if m.location.site and not is_valid_id(m.location.site):
        bad.append(FieldViolation(f"{field}.location.site", ID_RULE))
    if not (math.isfinite(m.location.x_km) and math.isfinite(m.location.y_km)):
        bad.append(FieldViolation(f"{field}.location", "coordinates must be finite"))
    for i, t in enumerate(m.task_affinities):
        if not is_valid_id(t):
            bad.append(FieldViolation(f"{field}.task_affinities[{i}]", ID_RULE))
    if bad:
        raise InvalidArgument.of(bad)
    return Device(
        m.device_id,
        kind or "",
        m.cores,
        m.location.site,
        m.location.x_km,
        m.location.y_km,
        tuple(dict.fromkeys(m.task_affinities)),
    )


def device_out(d: Device) -> core_broker_pb2.Device:
    return pb.Device(
        device_id=d.device_id,
        kind=kind_value(d.kind),  # type: ignore[arg-type]
        cores=d.cores,
        location=pb.Location(site=d.site, x_km=d.x_km, y_km=d.y_km),
        task_affinities=list(d.task_affinities),
    )


def reservation_out(
    record: dict[str, Any],
    version: int,
    request: core_broker_pb2.ReservationRequest | None = None,
) -> core_broker_pb2.Reservation:
    """A stored (or rejected) reservation record as the API shows it
    (`request`: the request it answers, when the caller has it at hand)."""
    parts = [p for p in record.get("parts") or [] if isinstance(p, dict) and not p.get("cancelled")]
    allocations = [
        pb.Allocation(
            device_id=p["dev"],
            cores=int(p["cores"]),
            start=timestamp(p["start"]),
            end=timestamp(p["end"]),
        )
        for p in parts
    ]
    out = pb.Reservation(
        reservation_id=record["id"],
        application_id=record["app"],
        outcome=pb.Outcome.Value("OUTCOME_" + record["outcome"]),  # type: ignore[arg-type]
        state=pb.ReservationState.Value("RESERVATION_STATE_" + record["state"]),  # type: ignore[arg-type]
        allocations=allocations,
        priority=pb.Priority(
            level=common_pb2.PriorityClass.Value("PRIORITY_CLASS_" + record["priority"]["level"]),  # type: ignore[arg-type]
            score=float(record["priority"]["score"]),
        ),
        summary=_summary(record, parts),
        created_at=timestamp(record["created"]),
        version=version,
    )
    if parts:
        first = min(int(p["start"]) for p in parts)
        out.cores_at_start = sum(int(p["cores"]) for p in parts if int(p["start"]) == first)
        out.start.CopyFrom(timestamp(first))
        out.end.CopyFrom(timestamp(max(int(p["end"]) for p in parts)))
    if record.get("earliest") is not None:
        out.earliest_possible_start.CopyFrom(timestamp(record["earliest"]))
    if request is not None:
        out.request.CopyFrom(request)
    elif record.get("request"):
        out.request.ParseFromString(base64.b64decode(record["request"]))
    return out


def _summary(record: dict[str, Any], parts: list[dict[str, Any]]) -> str:
    """A granted reservation's summary from its parts as they are now, as of its decision
    (an extension or an early release changes them after the decision's text was
    written); a rejection's, or one with no part left, as decided."""
    if record["outcome"] == "REJECTED" or not parts:
        return record.get("summary", "")
    return summary_of(
        [Allocation(p["dev"], int(p["cores"]), int(p["start"]), int(p["end"])) for p in parts],
        int(record["created"]),
    )


EVENT_TYPES = {
    name.removeprefix("RESERVATION_EVENT_TYPE_"): value
    for name, value in pb.ReservationEventType.items()
}
