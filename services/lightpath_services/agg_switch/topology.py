"""The aggregation tree (AG-1): switches, compute nodes and dedicated nodes,
validated once and then read-only (routing, hops, link costs, preset order).

Pure: built from plain values, no I/O. The store keeps it as JSON in Redis
under ``tree_key(tree, "topology")``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lightpath.errors import FieldViolation, InvalidArgument
from lightpath_services.common.keys import ID_RULE, is_valid_id
from lightpath_services.common.settings import parse_address

MAX_NODES = 10_000
MAX_THRESHOLD_MS = 3_600_000


class NodeKind(enum.StrEnum):
    SWITCH = "switch"
    COMPUTE = "compute"
    DEDICATED = "dedicated"


@dataclass(frozen=True)
class TreeNode:
    id: str
    kind: NodeKind
    parent: str | None
    threshold_ms: int = 0
    endpoint: str = ""
    link_cost: float = 1.0

    @property
    def threshold_s(self) -> float:
        return self.threshold_ms / 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "parent": self.parent or "",
            "threshold_ms": self.threshold_ms,
            "endpoint": self.endpoint,
            "link_cost": self.link_cost,
        }


@dataclass(frozen=True)
class Topology:
    """A validated tree. `nodes` keep their given order: a switch's children
    are ordered as listed, which is the preset combination order (AG-8)."""

    tree_id: str
    nodes: tuple[TreeNode, ...]
    timeout_aggregator: str = ""
    version: int = 0
    defined_at: float = 0.0

    # -- structure -------------------------------------------------------------

    @cached_property
    def by_id(self) -> dict[str, TreeNode]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def _children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            if n.parent is not None:
                out[n.parent].append(n.id)
        return out

    def children(self, node_id: str) -> list[str]:
        return self._children[node_id]

    @cached_property
    def root(self) -> str:
        return next(n.id for n in self.nodes if n.parent is None)

    def parent(self, node_id: str) -> str | None:
        return self.by_id[node_id].parent

    def kind(self, node_id: str) -> NodeKind:
        return self.by_id[node_id].kind

    def is_switch(self, node_id: str) -> bool:
        return node_id in self.by_id and self.by_id[node_id].kind is NodeKind.SWITCH

    def is_compute(self, node_id: str) -> bool:
        return node_id in self.by_id and self.by_id[node_id].kind is NodeKind.COMPUTE

    @property
    def switches(self) -> list[str]:
        return [n.id for n in self.nodes if n.kind is NodeKind.SWITCH]

    @property
    def compute_nodes(self) -> list[str]:
        return [n.id for n in self.nodes if n.kind is NodeKind.COMPUTE]

    @cached_property
    def preorder(self) -> list[str]:
        """Every node, a parent before its children, children in listed order."""
        out: list[str] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(self._children[node]))
        return out

    @cached_property
    def position(self) -> dict[str, int]:
        """Preorder index: the preset order of late contributions (AG-8)."""
        return {n: i for i, n in enumerate(self.preorder)}

    @cached_property
    def _subtree_end(self) -> dict[str, int]:
        """One past the preorder index of a node's last descendant."""
        end: dict[str, int] = {}
        for node in reversed(self.preorder):
            kids = self._children[node]
            end[node] = end[kids[-1]] if kids else self.position[node] + 1
        return end

    def in_subtree(self, node: str, top: str) -> bool:
        """Whether `node` is `top` or below it."""
        return self.position[top] <= self.position[node] < self._subtree_end[top]

    def path_to_root(self, node_id: str) -> list[str]:
        """`node_id`, its parent, …, the root."""
        out = [node_id]
        while (p := self.by_id[out[-1]].parent) is not None:
            out.append(p)
        return out

    def hops(self, node_id: str) -> int:
        """Links between the node and the root (AG-10 fewest hops)."""
        return len(self.path_to_root(node_id)) - 1

    def link_cost_to_root(self, node_id: str) -> float:
        """Sum of link costs from the node to the root (AG-10 lowest link cost)."""
        return sum(self.by_id[n].link_cost for n in self.path_to_root(node_id)[:-1])

    def next_hop(self, here: str, destination: str) -> str:
        """The neighbour of `here` on the tree path to `destination`."""
        if destination != here and self.in_subtree(destination, here):
            node = destination
            while (p := self.by_id[node].parent) != here:
                assert p is not None
                node = p
            return node
        parent = self.by_id[here].parent
        if parent is None:
            raise ValueError(f"{destination} is not in the tree of {here}")
        return parent

    def leaf_switch(self, compute_id: str) -> str:
        parent = self.by_id[compute_id].parent
        assert parent is not None
        return parent

    def neighbours(self, node_id: str) -> set[str]:
        out = set(self._children[node_id])
        if (p := self.by_id[node_id].parent) is not None:
            out.add(p)
        return out

    def default_timeout_aggregator(self) -> str:
        return self.timeout_aggregator or self.root

    # -- persistence -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "tree_id": self.tree_id,
            "nodes": [n.to_json() for n in self.nodes],
            "timeout_aggregator": self.timeout_aggregator,
            "version": self.version,
            "defined_at": self.defined_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Topology:
        """A stored topology (already validated when it was defined)."""
        return cls(
            tree_id=data["tree_id"],
            nodes=tuple(
                TreeNode(
                    id=n["id"],
                    kind=NodeKind(n["kind"]),
                    parent=n["parent"] or None,
                    threshold_ms=int(n["threshold_ms"]),
                    endpoint=n["endpoint"],
                    link_cost=float(n["link_cost"]),
                )
                for n in data["nodes"]
            ),
            timeout_aggregator=data.get("timeout_aggregator", ""),
            version=int(data.get("version", 0)),
            defined_at=float(data.get("defined_at", 0.0)),
        )


@dataclass(frozen=True)
class NodeSpec:
    """One node as a client describes it (before validation)."""

    id: str
    kind: NodeKind | None
    parent: str = ""
    threshold_ms: int = 0
    endpoint: str = ""
    link_cost: float = 0.0


def validate_topology(
    tree_id: str, specs: Iterable[NodeSpec], timeout_aggregator: str = ""
) -> Topology:
    """AG-1: a tree (one root switch, no cycles), every compute node and dedicated
    node under a switch, thresholds and endpoints well formed. Raises
    InvalidArgument naming every broken rule."""
    specs = list(specs)
    bad: list[FieldViolation] = []
    if not is_valid_id(tree_id):
        bad.append(FieldViolation("topology.tree_id", ID_RULE))
    if not specs:
        bad.append(FieldViolation("topology.nodes", "must list at least one switch"))
    if len(specs) > MAX_NODES:
        bad.append(FieldViolation("topology.nodes", f"at most {MAX_NODES} nodes"))
    seen: dict[str, int] = {}
    for i, s in enumerate(specs):
        f = f"topology.nodes[{i}]"
        if not is_valid_id(s.id):
            bad.append(FieldViolation(f"{f}.id", ID_RULE))
        elif s.id in seen:
            bad.append(FieldViolation(f"{f}.id", f"{s.id!r} is already nodes[{seen[s.id]}]"))
        else:
            seen[s.id] = i
        if s.kind is None:
            bad.append(FieldViolation(f"{f}.kind", "must be SWITCH, COMPUTE or DEDICATED"))
        if s.kind is NodeKind.SWITCH:
            if not 0 < s.threshold_ms <= MAX_THRESHOLD_MS:
                bad.append(
                    FieldViolation(
                        f"{f}.threshold_ms", f"a switch needs a threshold in 1..{MAX_THRESHOLD_MS}"
                    )
                )
        elif s.threshold_ms:
            bad.append(FieldViolation(f"{f}.threshold_ms", "only switches have a threshold"))
        if s.endpoint:
            if s.kind is NodeKind.COMPUTE:
                bad.append(
                    FieldViolation(
                        f"{f}.endpoint", "compute nodes reach their switch; they have no endpoint"
                    )
                )
            else:
                try:
                    parse_address(s.endpoint)
                except ValueError as exc:
                    bad.append(FieldViolation(f"{f}.endpoint", str(exc)))
        if not (math.isfinite(s.link_cost) and s.link_cost >= 0):
            bad.append(FieldViolation(f"{f}.link_cost", "must be a finite number >= 0"))
    kinds = {s.id: s.kind for s in specs}
    roots = [i for i, s in enumerate(specs) if not s.parent]
    for i in roots:
        if specs[i].kind is not NodeKind.SWITCH:
            bad.append(
                FieldViolation(
                    f"topology.nodes[{i}].parent",
                    "only the root switch has no parent; compute and dedicated nodes hang under a switch",
                )
            )
    root_switches = [i for i in roots if specs[i].kind is NodeKind.SWITCH]
    if specs and len(root_switches) != 1:
        bad.append(
            FieldViolation(
                "topology.nodes",
                "a tree has exactly one root switch (parent empty); found "
                + (", ".join(specs[i].id for i in root_switches) or "none"),
            )
        )
    for i, s in enumerate(specs):
        if not s.parent:
            continue
        f = f"topology.nodes[{i}].parent"
        if s.parent not in kinds:
            bad.append(FieldViolation(f, f"{s.parent!r} is not a node of the tree"))
        elif kinds[s.parent] is not NodeKind.SWITCH:
            bad.append(
                FieldViolation(f, f"{s.parent!r} is not a switch; only switches have children")
            )
        elif s.parent == s.id:
            bad.append(FieldViolation(f, "a node cannot be its own parent"))
    if not bad:
        parents = {s.id: s.parent for s in specs}
        for i, s in enumerate(specs):
            node, steps = s.id, 0
            while parents.get(node) and steps <= len(specs):
                node, steps = parents[node], steps + 1
            if steps > len(specs):
                bad.append(
                    FieldViolation(
                        f"topology.nodes[{i}].parent", f"{s.id!r} is on a cycle; the tree has none"
                    )
                )
                break
    if not bad and not any(s.kind is NodeKind.COMPUTE for s in specs):
        bad.append(FieldViolation("topology.nodes", "must hold at least one compute node"))
    if timeout_aggregator and timeout_aggregator not in kinds:
        bad.append(
            FieldViolation(
                "topology.timeout_aggregator", f"{timeout_aggregator!r} is not a node of the tree"
            )
        )
    if bad:
        raise InvalidArgument.of(bad, reason="INVALID_TOPOLOGY")
    topo = Topology(
        tree_id=tree_id,
        nodes=tuple(
            TreeNode(
                id=s.id,
                kind=s.kind,  # type: ignore[arg-type]
                parent=s.parent or None,
                threshold_ms=s.threshold_ms,
                endpoint=s.endpoint,
                link_cost=s.link_cost or 1.0,
            )
            for s in specs
        ),
        timeout_aggregator=timeout_aggregator,
    )
    unreachable = set(topo.by_id) - set(topo.preorder)
    if unreachable:  # pragma: no cover - the cycle check above rules this out
        raise InvalidArgument("topology.nodes", f"not under the root: {sorted(unreachable)}")
    return topo
