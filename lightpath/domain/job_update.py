"""A submitted job's priority and labels changed by a field mask (AIP-134, issue 19).

The cell scheduler and a pod's workload scheduler take the same request, a
JobSpec with the new values and a google.protobuf.FieldMask naming what to take
from it, so both check it here with the same words:

    "priority"        1..100; replaces a priority_class
    "priority_class"  LOW, MEDIUM or HIGH; replaces a priority
    "labels"          the whole map, replaced by the given one
    "labels.<key>"    one label: set to the given value, removed when not given

`parse_update` checks the mask and the values on their own (INVALID_ARGUMENT
naming `update_mask.paths[i]` or the `spec.` field); `UpdatePlan.apply` makes
the new spec from the job's current one and says, for people, what changed.
Nothing asked for is dropped: a path named twice, or `priority` with
`priority_class` (a job has one or the other), is refused, not merged. The
`tenant` label (RESERVED_LABELS) is the cell's: `labels.tenant` is refused and a
whole-map update keeps it (one naming another tenant is refused), at the cell
and at a pod alike (issue 33). Pure: no gRPC, no Redis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lightpath import limits
from lightpath.domain.jobs import priority_of
from lightpath.domain.slices import MAX_PRIORITY, MIN_PRIORITY
from lightpath.errors import FieldViolation, InvalidArgument
from lightpath.v1 import common_pb2, workload_scheduler_pb2

PRIORITY, PRIORITY_CLASS, LABELS = "priority", "priority_class", "labels"
TENANT_LABEL = "tenant"  # set by the cell from the caller's credential; never by an update
RESERVED_LABELS = (TENANT_LABEL,)
UPDATABLE = f"{PRIORITY}, {PRIORITY_CLASS}, {LABELS}, {LABELS}.<key>"
LABEL_KEY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?\Z")
LABEL_KEY_RULE = (
    "a label key is 1-63 characters of A-Z a-z 0-9 . _ / - starting and ending "
    "with a letter or digit"
)
MAX_LABELS = limits.LABELS
MAX_LABEL_VALUE = limits.LABEL_VALUE
_CLASS_NAMES = {
    int(v): common_pb2.PriorityClass.Name(v).removeprefix("PRIORITY_CLASS_")
    for v in common_pb2.PriorityClass.values()
    if v
}


@dataclass(frozen=True)
class JobUpdate:
    """The job's spec after an update, its effective priority, and what changed."""

    spec: workload_scheduler_pb2.JobSpec
    priority: int
    changes: tuple[str, ...]

    def describe(self) -> str:
        return "updated: " + "; ".join(self.changes) if self.changes else "unchanged"


@dataclass(frozen=True)
class UpdatePlan:
    """A checked mask: what to take from `patch`."""

    patch: workload_scheduler_pb2.JobSpec
    priority: bool
    priority_class: bool
    all_labels: bool
    label_keys: tuple[str, ...]
    reserved: frozenset[str] = frozenset()

    @property
    def paths(self) -> list[str]:
        out = [
            p for p, on in ((PRIORITY, self.priority), (PRIORITY_CLASS, self.priority_class)) if on
        ]
        if self.all_labels:
            out.append(LABELS)
        out += [f"{LABELS}.{k}" for k in self.label_keys]
        return out

    def apply(self, current: workload_scheduler_pb2.JobSpec) -> JobUpdate:
        """The update applied to the job's current spec (InvalidArgument when the result
        breaks a rule, e.g. too many labels)."""
        spec = workload_scheduler_pb2.JobSpec()
        spec.CopyFrom(current)
        before = priority_of(current, [])
        if self.priority or self.priority_class:
            spec.priority = self.patch.priority if self.priority else 0
            spec.priority_class = (
                self.patch.priority_class
                if self.priority_class
                else common_pb2.PRIORITY_CLASS_UNSPECIFIED
            )
        violations: list[FieldViolation] = []
        after = priority_of(spec, violations)
        if violations:
            raise InvalidArgument.of(violations)
        changes: list[str] = []
        if after != before:
            changes.append(f"priority {before} → {after}")
        old = dict(current.labels)
        new = dict(old)
        if self.all_labels:
            for key in sorted(self.reserved & set(self.patch.labels)):
                if self.patch.labels[key] != old.get(key, ""):
                    raise InvalidArgument(
                        f"spec.labels[{key}]",
                        f"{self.patch.labels[key]!r} is not the job's {key} "
                        f"{old.get(key, '')!r}; the {key} label cannot change",
                    )
            new = {k: v for k, v in old.items() if k in self.reserved}
            new.update({k: v for k, v in self.patch.labels.items() if k not in self.reserved})
        for key in self.label_keys:
            if key in self.patch.labels:
                new[key] = self.patch.labels[key]
            else:
                new.pop(key, None)
        if new != old:
            if len(new) > MAX_LABELS and len(new) > len(old):
                raise InvalidArgument("spec.labels", f"a job has at most {MAX_LABELS} labels")
            spec.ClearField("labels")
            for k, v in new.items():
                spec.labels[k] = v
            set_ = [f"{k}={new[k]}" for k in sorted(new) if old.get(k) != new[k]]
            gone = [k for k in sorted(old) if k not in new]
            if set_:
                changes.append("labels set " + ", ".join(set_))
            if gone:
                changes.append("labels removed " + ", ".join(gone))
        return JobUpdate(spec, after, tuple(changes))


def parse_update(
    patch: workload_scheduler_pb2.JobSpec,
    paths: Sequence[str],
    *,
    reserved: Iterable[str] = (),
) -> UpdatePlan:
    """Check an update's mask and values; `reserved` label keys cannot be set or removed
    (the cell's `tenant`). InvalidArgument naming each bad path or field."""
    reserved = frozenset(reserved)
    bad: list[FieldViolation] = []
    if not paths:
        bad.append(
            FieldViolation(
                "update_mask.paths", f"is required: name the fields to change ({UPDATABLE})"
            )
        )
    seen: dict[str, int] = {}
    keys: list[str] = []
    flags = {PRIORITY: False, PRIORITY_CLASS: False, LABELS: False}
    for i, path in enumerate(paths):
        at = f"update_mask.paths[{i}]"
        if path in seen:
            bad.append(
                FieldViolation(
                    at, f"{path!r} is named twice (also update_mask.paths[{seen[path]}])"
                )
            )
            continue
        seen[path] = i
        if path in flags:
            flags[path] = True
        elif path.startswith(LABELS + "."):
            key = path[len(LABELS) + 1 :]
            if not LABEL_KEY.match(key):
                bad.append(FieldViolation(at, f"{path!r}: {LABEL_KEY_RULE}"))
            elif key in reserved:
                bad.append(
                    FieldViolation(at, f"the {key!r} label is kept by the cell and cannot change")
                )
            else:
                keys.append(key)
        else:
            bad.append(
                FieldViolation(
                    at,
                    f"{path!r} cannot be updated"
                    + (" ('*' is not accepted: name the fields)" if path == "*" else "")
                    + f"; updatable: {UPDATABLE}",
                )
            )
    if flags[PRIORITY] and flags[PRIORITY_CLASS]:
        later = max(seen[PRIORITY], seen[PRIORITY_CLASS])
        bad.append(
            FieldViolation(
                f"update_mask.paths[{later}]",
                f"{PRIORITY!r} and {PRIORITY_CLASS!r} conflict: a job has a priority or a "
                "priority class; name one",
            )
        )
    if flags[LABELS] and keys:
        i = seen[f"{LABELS}.{keys[0]}"]
        bad.append(
            FieldViolation(
                f"update_mask.paths[{i}]",
                f"overlaps {LABELS!r} (the whole map is replaced already)",
            )
        )
    if flags[PRIORITY] and not MIN_PRIORITY <= patch.priority <= MAX_PRIORITY:
        bad.append(FieldViolation("spec.priority", f"must be {MIN_PRIORITY}..{MAX_PRIORITY}"))
    if flags[PRIORITY_CLASS] and patch.priority_class not in _CLASS_NAMES:
        bad.append(FieldViolation("spec.priority_class", "must be LOW, MEDIUM or HIGH"))
    if flags[LABELS] or keys:
        given = (
            patch.labels
            if flags[LABELS]
            else {k: patch.labels[k] for k in keys if k in patch.labels}
        )
        for key in sorted(given):
            value = given[key]
            field = f"spec.labels[{key}]"
            if flags[LABELS] and not LABEL_KEY.match(key):
                bad.append(FieldViolation(field, LABEL_KEY_RULE))
            elif flags[LABELS] and key in reserved:
                continue  # checked by the caller against the job (the cell: its tenant)
            if len(value) > MAX_LABEL_VALUE:
                bad.append(FieldViolation(field, f"must be at most {MAX_LABEL_VALUE} characters"))
        if flags[LABELS] and len(patch.labels) > MAX_LABELS:
            bad.append(FieldViolation("spec.labels", f"a job has at most {MAX_LABELS} labels"))
    if bad:
        raise InvalidArgument.of(bad)
    return UpdatePlan(
        patch, flags[PRIORITY], flags[PRIORITY_CLASS], flags[LABELS], tuple(keys), reserved
    )
