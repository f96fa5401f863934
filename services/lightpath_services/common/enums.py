"""Enums from clients. Proto3 enums are open: a request may carry a number no
value is defined for, and `Enum.Name` then raises ValueError. Naming one goes
through here, so an unknown value is INVALID_ARGUMENT naming the field (X-3)."""

from __future__ import annotations

from typing import Any

from lightpath.errors import InvalidArgument


def enum_name(enum: Any, value: int, field: str, prefix: str = "") -> str:
    """The name of `value` in `enum` without `prefix`; INVALID_ARGUMENT on `field` if unknown."""
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        known = ", ".join(
            n.removeprefix(prefix) for n in enum.keys() if not n.endswith("_UNSPECIFIED")
        )
        raise InvalidArgument(field, f"{value} is not a defined value; one of {known}") from None
