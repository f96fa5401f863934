"""What a Lightpath id may be (X-5): pod, job, tenant and resource ids name Redis
keys and appear in API resource names, so every service checks them the same way."""

from __future__ import annotations

import re

_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")  # \Z: "$" would let a trailing newline in
ID_RULE = "must be 1-64 characters of A-Z a-z 0-9 . _ -"


def validate_id(value: str, field: str = "id") -> str:
    """Return `value` if it is a valid id (X-5), else raise ValueError naming the rule."""
    if not _ID.match(value):
        raise ValueError(f"{field} {value!r} {ID_RULE}")
    return value


def is_valid_id(value: str) -> bool:
    return bool(_ID.match(value))
