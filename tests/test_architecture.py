"""The import rules of the code base, read from the source with `ast` (issue 17).

Every import counts: module level and inside functions or classes, absolute and
relative. Four rules:

(a) No module under services/<a>/ imports from services/<b>/ for a ≠ b;
    services/lightpath_services/common is shared by all and may be imported by any service.
(b) The domain package (lightpath/domain) is pure: it imports none of grpc,
    redis, asyncio, lightpath_services.*, and of lightpath only lightpath.domain,
    lightpath.errors and protobuf *message* modules lightpath.v1.*_pb2 (a job
    spec arrives as a JobSpec message; the *_pb2_grpc stubs are refused).
(c) No import cycle among the modules of both packages, counting
    the imports that run. Imports under `if TYPE_CHECKING:` never run, so they
    cannot make an import order fail, but a cycle through them is still two
    modules that each need the other to be understood; a second check counts
    them too and allows none either. The metrics modules of agg_switch,
    ocs_manager and workload_scheduler once closed such cycles by naming the
    orchestrator they read in annotations; they now take the plain data they
    read (a switch's core, a pod's store and fabric) or a small Protocol.
(d) Two distributions (issue 31): the client `lightpath` (lightpath/) imports nothing
    of the servers' `lightpath_services` (services/lightpath_services/), except the
    CLI's `lightpath sim` verb (lightpath.cli.sim) reaching the simulator
    (lightpath_services.sim), which it checks is installed first; and the simulator
    (issue 29) imports of the services only their pure decision modules
    (SIM_MAY_IMPORT): it decides with the services' own code, never with their
    servers, stores or clients.

Each rule's check is also run over a small planted tree that breaks it, so a
checker that finds nothing cannot pass unnoticed.
"""

from __future__ import annotations

import ast
import functools
import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

# The tree is read once per worker (read_imports is cached): keep these tests together.
pytestmark = pytest.mark.xdist_group("architecture")

ROOT = Path(__file__).resolve().parent.parent
# Each package and the directory that holds it (its distribution's project directory).
PACKAGES = {"lightpath": ".", "lightpath_services": "services"}
SERVICES = "lightpath_services"
DOMAIN = "lightpath.domain"


@dataclass(frozen=True)
class Import:
    importer: str  # module name of the importing file
    path: str  # the importing file, relative to the root
    line: int
    target: str  # module imported (the longest known module for names from it)
    type_checking: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.target}"


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, is a package) for every .py file under the packages."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, project in PACKAGES.items():
        base = root / project / pkg
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(root / project).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join(parts)] = (path, is_pkg)
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


@functools.lru_cache(maxsize=4)
def read_imports(root: Path) -> tuple[dict[str, tuple[Path, bool]], list[Import]]:
    """Every import statement of every module under `root`'s packages (read once per
    root: the callers only read what it answers)."""
    modules = _modules(root)
    imports: list[Import] = []
    for name, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        guarded = _type_checking_nodes(tree)
        package = name.split(".") if is_pkg else name.split(".")[:-1]
        rel = str(path.relative_to(root))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    kept = package[: len(package) - node.level + 1]
                    base = ".".join([*kept, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in modules else base)
            for t in targets:
                imports.append(Import(name, rel, node.lineno, t, id(node) in guarded))
    return modules, imports


def _known(target: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The module of ours that `target` names (itself or its nearest known parent)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cross_service_imports(root: Path) -> list[str]:
    _, imports = read_imports(root)
    bad = []
    for imp in imports:
        a, b = imp.importer.split("."), imp.target.split(".")
        if a[0] == b[0] == SERVICES and len(a) > 1 and len(b) > 1 and a[1] != "sim":
            if a[1] != b[1] and b[1] != "common":
                bad.append(str(imp))
    return list(dict.fromkeys(bad))


def _domain_may_import(target: str) -> bool:
    top = target.split(".")[0]
    if top in {"asyncio", "redis", SERVICES} or top.startswith("grpc"):
        return False
    if top != "lightpath":
        return True
    if target.startswith("lightpath.v1"):
        return target.endswith("_pb2")
    # lightpath.limits: the table of request limits (pure: protobuf descriptors and errors)
    return target in {"lightpath.errors", "lightpath.limits"} or target.split(".")[:2] == [
        "lightpath",
        "domain",
    ]


def impure_domain_imports(root: Path) -> list[str]:
    _, imports = read_imports(root)
    bad = [
        str(imp)
        for imp in imports
        if (imp.importer == DOMAIN or imp.importer.startswith(DOMAIN + "."))
        and not _domain_may_import(imp.target)
    ]
    return list(dict.fromkeys(bad))


SIM = "lightpath_services.sim"
CLI_SIM = "lightpath.cli.sim"  # the one client module that reaches the simulator
# The pure decision modules of the services: functions of a snapshot, no I/O.
SIM_MAY_IMPORT = frozenset(
    {
        "lightpath_services.workload_scheduler.planner",
        "lightpath_services.workload_scheduler.placement",
        "lightpath_services.workload_scheduler.box_placement",
        "lightpath_services.workload_scheduler.preemption",
        "lightpath_services.cell_scheduler.choice",
        "lightpath_services.cell_scheduler.quota",
    }
)


def lightpath_service_imports(root: Path) -> list[str]:
    """Imports that rule (d) refuses: of lightpath_services from lightpath, and of a
    service's non-decision module from the simulator."""
    _, imports = read_imports(root)
    bad = []
    for imp in imports:
        top, target = imp.importer.split(".")[0], imp.target.split(".")
        if target[0] != SERVICES:
            continue
        if top == "lightpath":
            if not (imp.importer == CLI_SIM and target[:2] == [SERVICES, "sim"]):
                bad.append(str(imp))
            continue
        in_sim = imp.importer == SIM or imp.importer.startswith(SIM + ".")
        if in_sim and target[1] != "sim" and imp.target not in SIM_MAY_IMPORT:
            bad.append(str(imp))
    return list(dict.fromkeys(bad))


def import_cycles(root: Path, *, type_checking: bool = False) -> list[str]:
    """One cycle per strongly connected component of the runtime import graph
    (with `type_checking`, of the graph that also has the imports under
    `if TYPE_CHECKING:`), each written as the chain of imports that closes it."""
    modules, imports = read_imports(root)
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        target = _known(imp.target, modules)
        if target and target != imp.importer and (type_checking or not imp.type_checking):
            edges[imp.importer].setdefault(target, imp)

    # Tarjan's strongly connected components, iterative (no recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))

    cycles = []
    for comp in components:
        members = set(comp)
        first = comp[0]
        # Shortest way back to `first` inside the component (breadth first).
        came: dict[str, str] = {}
        frontier = [first]
        while first not in came and frontier:
            nxt = []
            for v in frontier:
                for w in sorted(edges[v]):
                    if w in members and w not in came:
                        came[w] = v
                        nxt.append(w)
            frontier = nxt
        chain = [first]
        while True:
            prev = came[chain[-1]]
            chain.append(prev)
            if prev == first:
                break
        chain.reverse()
        steps = [str(edges[a][b]) for a, b in itertools.pairwise(chain)]
        cycles.append(" -> ".join(chain) + "\n    " + "\n    ".join(steps))
    return cycles


# -- the code base ----------------------------------------------------------------


def test_no_service_imports_another_service():
    assert cross_service_imports(ROOT) == []


def test_domain_package_is_pure():
    assert (ROOT / "lightpath" / "domain" / "__init__.py").exists()
    assert impure_domain_imports(ROOT) == []


def test_the_client_imports_no_server_and_the_simulator_only_decisions():
    assert lightpath_service_imports(ROOT) == []
    _, imports = read_imports(ROOT)
    # the rule is live: the simulator does import the planner
    assert any(
        i.importer.startswith(SIM) and i.target == "lightpath_services.workload_scheduler.planner"
        for i in imports
    )


def test_no_import_cycles():
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_import_cycles_through_annotations():
    cycles = import_cycles(ROOT, type_checking=True)
    assert not cycles, "import cycles (counting TYPE_CHECKING imports):\n" + "\n".join(cycles)


def test_the_reader_sees_imports_in_functions_and_relative_ones():
    _, imports = read_imports(ROOT)
    # A sample the reader must find, so an empty reading cannot pass the checks above.
    assert len(imports) > 500
    assert any(
        i.importer == "lightpath.domain.jobs" and i.target == "lightpath.domain.blocks"
        for i in imports
    )


# -- the checker itself, over a planted tree ----------------------------------------


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


PLANTED = {
    "services/lightpath_services/__init__.py": "",
    "services/lightpath_services/common/__init__.py": "",
    "services/lightpath_services/common/keys.py": "",
    "services/lightpath_services/alpha/__init__.py": "",
    "services/lightpath_services/alpha/server.py": (
        "from lightpath_services.common import keys\n"  # allowed
        "def build():\n"
        "    from lightpath_services.beta import store\n"  # nested, another service
        "    return store\n"
    ),
    "services/lightpath_services/alpha/loop.py": (
        "from . import cycle_b\n"  # relative: alpha.loop -> alpha.cycle_b
    ),
    "services/lightpath_services/alpha/cycle_b.py": "import lightpath_services.alpha.cycle_c\n",
    "services/lightpath_services/alpha/cycle_c.py": "def f():\n    from lightpath_services.alpha import loop\n",
    "services/lightpath_services/alpha/typed.py": (
        "from typing import TYPE_CHECKING\n"
        "from lightpath_services.alpha import hinted\n"
        "if TYPE_CHECKING:\n"
        "    from lightpath_services.alpha import typed\n"
    ),
    "services/lightpath_services/alpha/hinted.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lightpath_services.alpha import typed\n"
    ),
    "services/lightpath_services/beta/__init__.py": "",
    "services/lightpath_services/beta/store.py": "from ..alpha.server import build\n",  # relative, another service
    "lightpath/__init__.py": "",
    "lightpath/errors.py": "",
    "lightpath/client.py": "",
    "lightpath/v1/__init__.py": "",
    "lightpath/v1/common_pb2.py": "",
    "lightpath/v1/ocs_manager_pb2_grpc.py": "",
    "lightpath/domain/__init__.py": "",
    "lightpath/domain/ok.py": (
        "import math\nimport networkx\nfrom lightpath.errors import InvalidArgument\n"
        "from lightpath.v1 import common_pb2\nfrom . import ok2\n"
    ),
    "lightpath/domain/ok2.py": "",
    "services/lightpath_services/sim/__init__.py": "",
    "services/lightpath_services/sim/run.py": (
        "from lightpath_services.alpha import cycle_b\n"  # allowed only if a decision module
    ),
    "lightpath/tool.py": "from lightpath_services.alpha.server import build\n",
    "lightpath/cli/__init__.py": "",
    "lightpath/cli/sim.py": "def run():\n    from lightpath_services.sim import run\n",  # allowed
    "lightpath/domain/bad.py": (
        "import asyncio\n"
        "def f():\n    import redis.asyncio\n"
        "from lightpath.v1 import ocs_manager_pb2_grpc\n"
        "from grpc import aio\n"
        "from lightpath_services.common.keys import ID_RULE\n"
        "from lightpath.client import channel\n"
    ),
}


def test_checker_finds_planted_cross_service_imports(tmp_path):
    _plant(tmp_path, PLANTED)
    assert sorted(cross_service_imports(tmp_path)) == [
        "services/lightpath_services/alpha/server.py:3 imports lightpath_services.beta.store",
        "services/lightpath_services/beta/store.py:1 imports lightpath_services.alpha.server",
    ]


def test_checker_finds_planted_impure_domain_imports(tmp_path):
    _plant(tmp_path, PLANTED)
    assert sorted(impure_domain_imports(tmp_path)) == [
        "lightpath/domain/bad.py:1 imports asyncio",
        "lightpath/domain/bad.py:3 imports redis.asyncio",
        "lightpath/domain/bad.py:4 imports lightpath.v1.ocs_manager_pb2_grpc",
        "lightpath/domain/bad.py:5 imports grpc",
        "lightpath/domain/bad.py:6 imports lightpath_services.common.keys",
        "lightpath/domain/bad.py:7 imports lightpath.client",
    ]


def test_checker_finds_planted_server_imports_from_the_client(tmp_path):
    _plant(tmp_path, PLANTED)
    assert sorted(lightpath_service_imports(tmp_path)) == [
        "lightpath/domain/bad.py:6 imports lightpath_services.common.keys",
        "lightpath/tool.py:1 imports lightpath_services.alpha.server",
        "services/lightpath_services/sim/run.py:1 imports lightpath_services.alpha.cycle_b",
    ]


def _members(cycle: str) -> frozenset[str]:
    return frozenset(cycle.split("\n")[0].split(" -> "))


def test_checker_finds_planted_cycles_and_names_their_imports(tmp_path):
    _plant(tmp_path, PLANTED)
    cycles = import_cycles(tmp_path)
    # alpha.server -> beta.store -> alpha.server, and the three-module loop; the
    # TYPE_CHECKING-only pair typed <-> hinted is not a cycle.
    assert len(cycles) == 2, cycles
    text = "\n".join(cycles)
    assert (
        "services/lightpath_services/alpha/loop.py:1 imports lightpath_services.alpha.cycle_b"
        in text
    )
    assert (
        "services/lightpath_services/alpha/cycle_b.py:1 imports lightpath_services.alpha.cycle_c"
        in text
    )
    assert (
        "services/lightpath_services/alpha/cycle_c.py:2 imports lightpath_services.alpha.loop"
        in text
    )
    assert (
        "services/lightpath_services/beta/store.py:1 imports lightpath_services.alpha.server"
        in text
    )
    assert (
        "services/lightpath_services/alpha/server.py:3 imports lightpath_services.beta.store"
        in text
    )
    assert "hinted" not in text
    # Counting the imports under TYPE_CHECKING, typed <-> hinted is one more.
    with_annotations = import_cycles(tmp_path, type_checking=True)
    assert len(with_annotations) == 3, with_annotations
    assert any(
        _members(c) == {"lightpath_services.alpha.typed", "lightpath_services.alpha.hinted"}
        for c in with_annotations
    )
