"""Redis key names (X-4).

Every key starts with `lp:` and carries a hash tag, the part in braces, that
names the shard of state it belongs to: a pod (`lp:{pod-1}:block:7`), a tenant
(`lp:{t:acme}:...`), a switch tree, or the cell. Redis Cluster hashes only the
tag, so all keys of one pod land in one slot and a Lua script or MULTI/EXEC may
touch any of them together.
"""

from __future__ import annotations

from lightpath.domain.ids import ID_RULE, is_valid_id, validate_id
from lightpath.errors import FieldViolation, InvalidArgument

PREFIX = "lp"


def require_id(value: str, field: str) -> str:
    """`value` if it is a valid id, else INVALID_ARGUMENT naming `field`: ids name
    Redis keys, so a malformed one must be refused at the API, never reach a key (X-3)."""
    if not is_valid_id(value):
        raise InvalidArgument(field, ID_RULE)
    return value


def require_ids(**fields: str) -> None:
    """`require_id` for several fields at once, every bad one named."""
    bad = [FieldViolation(f, ID_RULE) for f, v in fields.items() if not is_valid_id(v)]
    if bad:
        raise InvalidArgument.of(bad)


def _key(tag: str, parts: tuple[object, ...]) -> str:
    for p in parts:
        s = str(p)
        if not s or "{" in s or "}" in s:
            raise ValueError(f"key part {s!r} must be non-empty and free of braces")
    return ":".join([PREFIX, "{" + tag + "}", *map(str, parts)])


def pod_key(pod_id: str, *parts: object) -> str:
    """`pod_key("pod-1", "block", 7)` → `lp:{pod-1}:block:7`."""
    return _key(validate_id(pod_id, "pod_id"), parts)


def tenant_key(tenant: str, *parts: object) -> str:
    """`tenant_key("acme", "app")` → `lp:{t:acme}:app`."""
    return _key("t:" + validate_id(tenant, "tenant"), parts)


def tree_key(tree_id: str, *parts: object) -> str:
    """State of one aggregation switch tree: `lp:{agg:tree-1}:...`."""
    return _key("agg:" + validate_id(tree_id, "tree_id"), parts)


def cell_key(*parts: object) -> str:
    """Cell-wide state (the pod registry, the cell queue): `lp:{cell}:...`."""
    return _key("cell", parts)


def broker_key(*parts: object) -> str:
    """Core broker state, one shard so reservations over many devices commit together: `lp:{broker}:...`."""
    return _key("broker", parts)


def hash_tag(key: str) -> str:
    """The part Redis Cluster hashes: the text inside the first {...}."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]
