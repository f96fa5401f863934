"""Mutation testing of the domain code and the planners (issue 17). Not in CI.

    python3 bench/mutation.py --modules planners --jobs 2        # issue 17's scope
    python3 bench/mutation.py                                    # all of MODULES
    python3 bench/mutation.py --modules lightpath.domain.torus --max-mutants 50 --seed 1
    python3 bench/mutation.py --survivors-of last.json --jobs 2  # after adding tests

A full `--modules planners` run (1,408 mutants) took 26 minutes with `--jobs 2` on a
2-core machine that other work was also using; `--max-mutants` bounds a run,
`--match REGEX` picks mutants by "module:line: mutation", `--list` only lists them.

Why not mutmut: it needs its own `[tool.mutmut]` configuration and runs the whole
suite (real Redis and gRPC servers) to map tests to mutants, and names mutants per
function rather than per line; picking a module's pure tests by hand keeps a run
to seconds per mutant and lets equivalent mutants be listed by line.

Each mutant is one small change to one module, made in the source text:

- a comparison flipped at its boundary or negated (`<`↔`<=`, `>`↔`>=`,
  `==`↔`!=`, `in`↔`not in`, `is`↔`is not`);
- an arithmetic or bitwise operator swapped (`+`↔`-`, `*`↔`/`, `//`→`/`,
  `%`→`//`, `|`↔`&`, also in `+=` and the like);
- `and`↔`or`;
- a number off by one (n → n+1), `True`↔`False`;
- a `not` or a unary minus dropped;
- `return X` → `return None`.

Docstrings, annotations, f-strings, decorators and asserts are left alone.
For every mutant the module's fast pure-function tests (`MODULES`: no Redis,
no gRPC) run with `-x` in a forked process (third-party imports are done once,
before forking) under a timeout; a failing or timed-out run kills the mutant.
Hypothesis runs derandomized and without shrinking, so a run is repeatable.

Where: by default in a scratch copy of the work tree (colleagues' test runs
never see a mutant); `--in-place` mutates the work tree itself. Either way the
original bytes are written back in a `finally`, a backup is kept beside the
tree while a mutant is applied (the next run restores it if this one was
killed hard), and at the end each module must equal its original
(`git diff --quiet` on it, in place).

Prints one JSON line: mutants, killed, survived (module, line, mutation),
equivalent (with the reason, from `EQUIVALENT` below), kill_rate = killed /
(mutants - equivalent), per-module figures and the run's seconds. Goal: a
kill_rate >= 0.85.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Issue 17's scope: the planners and the domain code named there (a full run of
# these alone: `--modules planners`).
PLANNERS = (
    "lightpath_services.workload_scheduler.preemption",
    "lightpath_services.workload_scheduler.planner",
    "lightpath_services.workload_scheduler.placement",
    "lightpath_services.workload_scheduler.switched_placement",
    "lightpath.domain.torus",
    "lightpath.domain.switched_rings",
    "lightpath.aggregation.maths",
    "lightpath_services.core_broker.decisions",
)

# Module (import name) -> its fast pure-function tests, the most telling first
# (`-x` stops at the first failure). A module that moves is a one-line change here.
MODULES: dict[str, tuple[str, ...]] = {
    "lightpath_services.workload_scheduler.preemption": (
        "tests/workload_scheduler/test_pinned_preemption.py",
        "tests/workload_scheduler/test_pinned_victims.py",
        "tests/workload_scheduler/test_preemption.py",
    ),
    "lightpath_services.workload_scheduler.planner": (
        "tests/workload_scheduler/test_pinned_planner.py",
        "tests/workload_scheduler/test_preemption.py",
        "tests/workload_scheduler/test_placement.py",
    ),
    "lightpath_services.workload_scheduler.placement": (
        "tests/workload_scheduler/test_placement.py",
        "tests/workload_scheduler/test_pinned_podstate.py",
        "tests/workload_scheduler/test_pinned_planner.py",
        "tests/workload_scheduler/test_preemption.py",
        "tests/workload_scheduler/test_pinned_preemption.py",
    ),
    "lightpath_services.workload_scheduler.switched_placement": (
        "tests/switched/test_placement.py",
        "tests/switched/test_pinned_placement.py",
        "tests/switched/test_rings.py",
        "tests/switched/test_properties.py",
    ),
    "lightpath.domain.torus": (
        "tests/ocs_manager/test_pinned_fabric.py",
        "tests/ocs_manager/test_pinned_config.py",
        "tests/ocs_manager/test_pinned_ids.py",
        "tests/ocs_manager/test_fabric.py",
        "tests/ocs_manager/test_invariants.py",
        "tests/ocs_manager/test_wiring.py",
        "tests/ocs_manager/test_encode.py",
    ),
    "lightpath.domain.switched_rings": (
        "tests/switched/test_pinned_rings.py",
        "tests/switched/test_pinned_ring_edges.py",
        "tests/switched/test_pinned_layouts.py",
        "tests/switched/test_pinned_layout_table.py",
        "tests/switched/test_pinned_routes.py",
        "tests/switched/test_pinned_failures.py",
        "tests/switched/test_rings.py",
        "tests/switched/test_placement.py",
        "tests/switched/test_properties.py",
    ),
    "lightpath.aggregation.maths": (
        "tests/agg_switch/test_pinned_exact.py",
        "tests/agg_switch/test_pinned_aggregation.py",
        "tests/agg_switch/test_aggregation.py",
        "tests/agg_switch/test_seed_examples.py",
        "tests/agg_switch/test_pinned_fallback.py",
    ),
    "lightpath_services.core_broker.decisions": (
        "tests/core_broker/test_decisions.py",
        "tests/core_broker/test_pinned_decisions.py",
        "tests/core_broker/test_properties.py",
    ),
    # The rest of the domain package (issue 17's lightpath/domain/).
    "lightpath.domain.rings": ("tests/workload_scheduler/test_rings.py",),
    "lightpath.domain.switched": (
        "tests/switched/test_fabric.py",
        "tests/switched/test_pinned_rings.py",
        "tests/switched/test_rings.py",
    ),
    "lightpath.domain.blocks": (
        "tests/workload_scheduler/test_placement.py",
        "tests/workload_scheduler/test_pinned_planner.py",
    ),
    "lightpath.domain.slices": (
        "tests/workload_scheduler/test_pinned_planner.py",
        "tests/workload_scheduler/test_placement.py",
        "tests/workload_scheduler/test_preemption.py",
    ),
    "lightpath.domain.ids": ("tests/common/test_keys.py", "tests/common/test_validate.py"),
    # lightpath.domain.jobs (job specs, normalisation) is tested through the servers only:
    # add it here with pure tests of its own.
}

# Mutants judged equivalent (no observable behaviour changes), by
# (module, line, mutation) as printed in `survived`, with the reason.
EQUIVALENT: dict[tuple[str, int, str], str] = {
    ("lightpath.domain.switched_rings", 457, "1 -> 2 @30"): (
        "a reserved channel marked 2 instead of 1 in the router's working copy: only its "
        "truth is read (and the memo keys on it, which changes hits, not hops)"
    ),
    ("lightpath.domain.switched_rings", 471, "1 -> 2 @46"): (
        "the same: channels marked 2 instead of 1 in the working copy"
    ),
    ("lightpath.domain.switched_rings", 464, "1 -> 2 @56"): (
        "the 'no free channel' sentinel -1 -> -2: tested only as < 0"
    ),
    ("lightpath.domain.switched_rings", 469, "1 -> 2 @65"): (
        "the 'no free channel' sentinel -1 -> -2: tested only as >= 0"
    ),
    ("lightpath.domain.switched_rings", 292, "0 -> 1 @11"): (
        "_layouts: `rank` only breaks ties between candidates in the order they were made; "
        "starting it at 1 keeps that order"
    ),
    ("lightpath_services.workload_scheduler.switched_placement", 119, "- -> + @21"): (
        "tile shapes of one area: h + w and |h - w| both grow with how far h is from the "
        "square root, so they sort the same"
    ),
    ("lightpath_services.workload_scheduler.switched_placement", 144, "- -> + @18"): (
        "the skip of groups with too few free processors is a shortcut: every tile is "
        "checked against the taken processors anyway"
    ),
    ("lightpath_services.workload_scheduler.switched_placement", 211, "1 -> 2 @28"): (
        "the kind key of a column line (rows 0, columns 1 -> 2) only orders rows before "
        "columns, which 2 still does"
    ),
    ("lightpath_services.workload_scheduler.switched_placement", 261, "<= -> < @16"): (
        "_fill with nothing left to pick goes on picking [] from the next rows: same result"
    ),
    ("lightpath_services.workload_scheduler.switched_placement", 263, "<= -> < @19"): (
        "a row with exactly as many groups as are left: all of them either way (the "
        "result is sorted)"
    ),
    ("lightpath.domain.torus", 258, "1 -> 2 @39"): (
        "ocs_of_index: the loop stops at d = -2 instead of -1, but always returns at d = 0 "
        "(axis_offset[0] is 0)"
    ),
    ("lightpath.domain.torus", 278, "1 -> 2 @39"): (
        "one_to_many_of_index: the same loop bound, returned from at d = 0 as above"
    ),
    ("lightpath_services.workload_scheduler.planner", 235, "or -> and @30"): (
        "switched_state's `large` maps a held group to its holder, but placement reads only "
        "which groups it holds (SwitchedPodState.free_groups), never the holder"
    ),
    ("lightpath.aggregation.maths", 491, "<= -> < @60"): (
        "`carried` never equals `expected`: expected holds the node itself and a late "
        "switch never names itself among the nodes it carries, so subset == proper subset"
    ),
    ("lightpath.aggregation.maths", 266, "False -> True @16"): (
        "reference(): the first accumulate() takes its input as is and resets `owned`"
    ),
    ("lightpath.aggregation.maths", 308, "False -> True @22"): (
        "Fold: the first _take() finds no accumulator and resets `owned`"
    ),
    ("lightpath.aggregation.maths", 403, "False -> True @18"): (
        "_TaChunk: the first _take() finds no accumulator and resets `owned`"
    ),
    ("lightpath.aggregation.maths", 111, "16 -> 17 @13"): (
        "BLOCK is how many elements EXACT converts at a time; each element sees the same "
        "operations whatever the block (the module says so), so only speed changes"
    ),
    ("lightpath.aggregation.maths", 111, "1 -> 2 @8"): (
        "BLOCK = 2 << 16 instead of 1 << 16: the conversion's block size, as above"
    ),
    ("lightpath.domain.switched_rings", 602, "200000 -> 200001 @14"): (
        "the size at which the per-fabric hop memo is cleared: a cache bound, not a result"
    ),
    ("lightpath.domain.switched_rings", 528, "> -> >= @25"): (
        "the memo is cleared one entry earlier: a cache bound, not a result"
    ),
    ("lightpath.domain.switched_rings", 608, "is not -> is @33"): (
        "a fresh memo per call instead of the fabric's: the same hops, searched again"
    ),
    ("lightpath.domain.switched_rings", 608, "0 -> 1 @30"): (
        "entry[1] is never the fabric, so a fresh memo per call: the same hops, searched again"
    ),
    ("lightpath.domain.switched_rings", 609, "> -> >= @23"): (
        "memos of other fabrics dropped one fabric earlier: a cache bound"
    ),
    ("lightpath.domain.switched_rings", 609, "8 -> 9 @25"): (
        "memos of other fabrics dropped one fabric later: a cache bound"
    ),
    ("lightpath_services.workload_scheduler.placement", 241, "< -> <= @30"): (
        "_prefer may hand back one block more than n; place() takes exactly the demanded count"
    ),
    ("lightpath_services.workload_scheduler.placement", 231, "<= -> < @9"): (
        "K = 1 then takes the round-robin path over one OCS group: the same ordered[:n]"
    ),
    ("lightpath_services.workload_scheduler.planner", 259, "1 -> 2 @31"): (
        "one more candidate drawn: attempts % (attempts + 2) == attempts % (attempts + 1) "
        "when that many exist, and the same candidates when fewer do"
    ),
    ("lightpath_services.workload_scheduler.preemption", 81, "> -> >= @66"): (
        "_useful: a term with n == 0 adds min(0, gained) = 0; deficits are never negative"
    ),
    ("lightpath_services.workload_scheduler.preemption", 108, "> -> >= @68"): (
        "a candidate that frees nothing useful is never picked by the greedy (a useful one "
        "is left while anything is missing) and its priority level alone never covers"
    ),
}

# Third-party imports done once before forking (the project's own modules are
# imported fresh in each child, from the mutated file).
PREIMPORT = (
    "numpy",
    "networkx",
    "hypothesis",
    "pytest",
    "_pytest.python",
    "pytest_asyncio",
    "pytest_timeout",
    "xdist",
    "opentelemetry.sdk.trace",
    "redis.asyncio",
    "cryptography.x509",
    "grpc",
    "google.protobuf",
)


# -- mutants --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    module: str
    line: int
    mutation: str
    start: int  # byte offsets in the source
    end: int
    text: bytes

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.module, self.line, self.mutation)

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.text + source[self.end :]


_CMP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_BIN = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"),
    ast.Mod: ("%", "//"),
    ast.BitOr: ("|", "&"),
    ast.BitAnd: ("&", "|"),
}
_BOOL = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


class _Source:
    def __init__(self, data: bytes):
        self.data = data
        self.line_start = [0]
        for i, b in enumerate(data):
            if b == 0x0A:
                self.line_start.append(i + 1)

    def offset(self, line: int, col: int) -> int:
        return self.line_start[line - 1] + col

    def position(self, offset: int) -> tuple[int, int]:
        """(line, column) of a byte offset; the column in characters, as an editor shows it."""
        line = bisect.bisect_right(self.line_start, offset)
        return line, len(self.data[self.line_start[line - 1] : offset].decode())

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


def _find_op(src: _Source, lo: int, hi: int, op: str) -> tuple[int, int] | None:
    """Byte span of operator `op` between two operands (parens, spaces, comments around)."""
    gap = src.data[lo:hi].decode()
    masked = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), gap)
    if op[0].isalpha():
        pattern = r"\b" + r"\s+".join(op.split()) + r"\b"
    else:
        pattern = r"(?<![<>=!*/%|&+\-])" + re.escape(op) + r"(?![<>=*/])"
    found = list(re.finditer(pattern, masked))
    if len(found) != 1:
        return None
    a = len(gap[: found[0].start()].encode())
    b = len(gap[: found[0].end()].encode())
    return lo + a, lo + b


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, src: _Source):
        self.module = module
        self.src = src
        self.out: list[Mutant] = []

    def add(self, node: ast.AST, start: int, end: int, text: str, mutation: str) -> None:
        line, col = self.src.position(start)
        self.out.append(Mutant(self.module, line, f"{mutation} @{col}", start, end, text.encode()))

    # what is never mutated
    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    def visit_Assert(self, node: ast.Assert) -> None:
        return

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_arg(self, node: ast.arg) -> None:
        return

    def _body(self, body: list[ast.stmt]) -> None:
        for i, stmt in enumerate(body):
            is_doc = (
                i == 0
                and isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            )
            if not is_doc:
                self.visit(stmt)

    def visit_Module(self, node: ast.Module) -> None:
        self._body(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for b in node.bases:
            self.visit(b)
        self._body(node.body)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.visit(node.args)
        self._body(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if "__slots__" in names or "__all__" in names:
            return
        self.generic_visit(node)

    # the mutations
    def visit_Compare(self, node: ast.Compare) -> None:
        left: ast.expr = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            old, new = _CMP[type(op)]
            span = _find_op(self.src, self.src.end(left), self.src.start(right), old)
            if span is not None:
                self.add(node, *span, new, f"{old} -> {new}")
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._swap(node, type(node.op), node.left, node.right)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        ops = _BIN.get(type(node.op))
        if ops is not None:
            old, new = ops[0] + "=", ops[1] + "="
            span = _find_op(self.src, self.src.end(node.target), self.src.start(node.value), old)
            if span is not None:
                self.add(node, *span, new, f"{old} -> {new}")
        self.generic_visit(node)

    def _swap(self, node: ast.AST, op: type, left: ast.AST, right: ast.AST) -> None:
        ops = _BIN.get(op)
        if ops is None:
            return
        old, new = ops
        span = _find_op(self.src, self.src.end(left), self.src.start(right), old)
        if span is not None:
            self.add(node, *span, new, f"{old} -> {new}")

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = _BOOL[type(node.op)]
        for left, right in zip(node.values, node.values[1:], strict=False):
            span = _find_op(self.src, self.src.end(left), self.src.start(right), old)
            if span is not None:
                self.add(node, *span, new, f"{old} -> {new}")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not) or (
            isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant)
        ):
            inner = self.src.data[self.src.start(node.operand) : self.src.end(node.operand)]
            what = "not" if isinstance(node.op, ast.Not) else "-"
            self.add(
                node,
                self.src.start(node),
                self.src.end(node),
                f"({inner.decode()})",
                f"drop {what}",
            )
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        start, end = self.src.start(node), self.src.end(node)
        if isinstance(v, bool):
            self.add(node, start, end, str(not v), f"{v} -> {not v}")
        elif isinstance(v, int):
            self.add(node, start, end, str(v + 1), f"{v} -> {v + 1}")
        elif isinstance(v, float):
            self.add(node, start, end, repr(v + 1.0), f"{v!r} -> {v + 1.0!r}")

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        # `return False` -> None is falsy either way: not worth a mutant
        if value is not None and not (
            isinstance(value, ast.Constant) and value.value in (None, False)
        ):
            self.add(node, self.src.start(value), self.src.end(value), "None", "return None")
        self.generic_visit(node)


def mutants_of(module: str, data: bytes) -> list[Mutant]:
    src = _Source(data)
    collector = _Collector(module, src)
    collector.visit(ast.parse(data))
    out = []
    for m in collector.out:
        try:  # a mutant must still compile (skip the rare splice that does not)
            ast.parse(m.apply(data))
        except SyntaxError:
            continue
        out.append(m)
    return sorted(out, key=lambda m: (m.start, m.mutation))


def module_path(root: Path, module: str) -> Path:
    """The file of an import name, found without importing it."""
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    raise SystemExit(f"mutation: module {module} not found under {root} (moved? update MODULES)")


# -- running ------------------------------------------------------------------------


class _Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise _Stop(signum)


def _child(root: Path, tests: list[str], timeout: float, log: Path) -> None:
    """In the forked child: run pytest on `tests` from `root`; never returns."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(root)
        sys.path.insert(0, str(root))
        sys.dont_write_bytecode = True
        from hypothesis import HealthCheck, Phase, settings

        # Loaded by hypothesis' pytest plugin at configure time, after tests/conftest.py
        # loaded its own: what that one sets, plus repeatable and without shrinking.
        settings.register_profile(
            "mutation",
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
            print_blob=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        )
        import pytest

        rc = pytest.main(
            [
                *tests,
                "-x",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "--timeout",
                str(int(timeout) + 1),
                "--hypothesis-profile",
                "mutation",
            ]
        )
        code = int(rc)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_running: list[int] = []  # the child under way, killed if the run stops


def _kill_running() -> None:
    while _running:
        pid = _running.pop()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def run_tests(root: Path, tests: list[str], timeout: float, log: Path) -> tuple[str, float]:
    """('passed' | 'failed' | 'timeout', seconds) of the tests in a forked child."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        _child(root, tests, timeout, log)
    _running.append(pid)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _running.remove(pid)
            rc = os.waitstatus_to_exitcode(status)
            return ("passed" if rc == 0 else "failed"), time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            _kill_running()
            return "timeout", time.monotonic() - t0
        time.sleep(0.02)


def scratch_copy(dest: Path) -> None:
    """The work tree as it is now (tracked and untracked, not ignored files)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        rel = f.decode()
        src = ROOT / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


class Restorer:
    """Write a module's original bytes back whatever happens; a backup beside the
    tree covers a run killed too hard for `finally`."""

    def __init__(self, root: Path):
        self.backups = root / ".mutation-backup"

    def recover(self) -> list[str]:
        restored = []
        if self.backups.is_dir():
            for b in self.backups.iterdir():
                target = Path(bytes.fromhex(b.name).decode())
                target.write_bytes(b.read_bytes())
                restored.append(str(target))
                b.unlink()
            self.backups.rmdir()
        return restored

    def applied(self, path: Path, original: bytes, mutant: bytes) -> None:
        self.backups.mkdir(exist_ok=True)
        (self.backups / str(path).encode().hex()).write_bytes(original)
        path.write_bytes(mutant)

    def restore(self, path: Path, original: bytes) -> None:
        path.write_bytes(original)
        backup = self.backups / str(path).encode().hex()
        backup.unlink(missing_ok=True)


def _prepare(root: Path, modules: list[str], log: Path) -> dict[str, float]:
    """Seconds of each module's tests unmutated; refuse to go on when they fail, or when
    they still pass with the module broken (they would not be testing this file)."""
    restorer = Restorer(root)
    baseline: dict[str, float] = {}
    for m in modules:
        tests = [t for t in MODULES[m] if (root / t).is_file()]
        state, secs = run_tests(root, tests, 600, log)
        if state != "passed":
            raise SystemExit(
                f"mutation: {m}'s tests fail unmutated ({state}):\n" + log.read_text()[-3000:]
            )
        baseline[m] = secs
        path = module_path(root, m)
        original = path.read_bytes()
        try:
            restorer.applied(path, original, b"raise RuntimeError('canary')\n" + original)
            state, _ = run_tests(root, tests, 600, log)
        finally:
            restorer.restore(path, original)
        if state != "failed":
            raise SystemExit(f"mutation: {m}'s tests pass with the module broken: wrong file?")
    return baseline


def _run_shard(
    root: Path,
    shard: list[tuple[int, Mutant]],
    baseline: dict[str, float],
    total: int,
    verbose: bool,
) -> dict[int, str]:
    """Run each mutant of `shard` in `root`; every module is written back in a `finally`."""
    restorer = Restorer(root)
    log = Path(tempfile.mkstemp(prefix="mutation-", suffix=".log")[1])
    modules = sorted({m.module for _, m in shard})
    originals = {m: module_path(root, m).read_bytes() for m in modules}
    results: dict[int, str] = {}
    try:
        for n, mutant in shard:
            path = module_path(root, mutant.module)
            original = originals[mutant.module]
            tests = [t for t in MODULES[mutant.module] if (root / t).is_file()]
            timeout = max(10.0, 3 * baseline[mutant.module] + 5)
            try:
                restorer.applied(path, original, mutant.apply(original))
                state, secs = run_tests(root, tests, timeout, log)
            finally:
                restorer.restore(path, original)
            results[n] = state
            if verbose:
                print(
                    f"[{n + 1}/{total}] {mutant.module}:{mutant.line} {mutant.mutation}: "
                    f"{state} ({secs:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        _kill_running()
        for m, data in originals.items():
            p = module_path(root, m)
            if p.read_bytes() != data:
                p.write_bytes(data)
        log.unlink(missing_ok=True)
    return results


def _fork_shard(
    root: Path,
    shard: list[tuple[int, Mutant]],
    baseline: dict[str, float],
    total: int,
    verbose: bool,
    out: Path,
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        signal.signal(signal.SIGTERM, _on_signal)
        out.write_text(json.dumps(_run_shard(root, shard, baseline, total, verbose)))
    except BaseException:
        code = 1
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--modules", nargs="+", help="import names, or 'planners' (default: all of MODULES)"
    )
    ap.add_argument("--max-mutants", type=int, default=0, help="random sample of this many")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--match", help="only mutants whose 'module:line: mutation' matches this regex")
    ap.add_argument("--jobs", type=int, default=1, help="scratch copies run side by side")
    ap.add_argument("--in-place", action="store_true", help="mutate the work tree itself")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--verbose", action="store_true", help="a line per mutant on stderr")
    ap.add_argument(
        "--rescore",
        metavar="JSON",
        help="re-apply today's EQUIVALENT list to a run's JSON line (from a file) and print it",
    )
    ap.add_argument(
        "--survivors-of",
        metavar="JSON",
        help="run only the survivors of an earlier run (its JSON line, in a file) and print "
        "that run's figures with those now killed moved to killed",
    )
    args = ap.parse_args(argv)
    if args.rescore:
        print(json.dumps(rescore(json.loads(Path(args.rescore).read_text().splitlines()[-1]))))
        return 0

    modules = args.modules or list(MODULES)
    if modules == ["planners"]:
        modules = list(PLANNERS)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        ap.error(f"not in MODULES: {', '.join(unknown)}")
    if args.in_place and args.jobs != 1:
        ap.error("--in-place runs one job")

    all_mutants: list[Mutant] = []
    for m in modules:
        all_mutants.extend(mutants_of(m, module_path(ROOT, m).read_bytes()))
    chosen = [m for m in all_mutants if not args.match or re.search(args.match, _label(m))]
    earlier = None
    if args.survivors_of:
        earlier = rescore(json.loads(Path(args.survivors_of).read_text().splitlines()[-1]))
        wanted = {(r["module"], r["line"], r["mutation"]) for r in earlier["survived"]}
        chosen = [m for m in chosen if m.key in wanted]
    if args.max_mutants and args.max_mutants < len(chosen):
        chosen = sorted(
            random.Random(args.seed).sample(chosen, args.max_mutants),
            key=lambda m: (modules.index(m.module), m.start, m.mutation),
        )
    if args.list:
        for m in chosen:
            print(_label(m))
        return 0

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for name in PREIMPORT:
        __import__(name)

    t_start = time.monotonic()
    git_quiet_before = args.in_place and _git_quiet(_paths(modules))
    roots: list[Path] = []
    if args.in_place:
        roots.append(ROOT)
        recovered = Restorer(ROOT).recover()
        if recovered:
            print(f"mutation: restored {recovered} left by a killed run", file=sys.stderr)
    originals = {m: module_path(ROOT, m).read_bytes() for m in modules}
    old_handlers = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    workers: list[int] = []
    results: dict[Mutant, str] = {}
    try:
        if not args.in_place:
            for _ in range(max(1, args.jobs)):
                scratch = Path(tempfile.mkdtemp(prefix="lightpath-mutation-"))
                roots.append(scratch)
                scratch_copy(scratch)
        log = Path(tempfile.mkstemp(prefix="mutation-", suffix=".log")[1])
        try:
            baseline = _prepare(roots[0], modules, log)
        finally:
            log.unlink(missing_ok=True)
        indexed = list(enumerate(chosen))
        if len(roots) == 1:
            got = _run_shard(roots[0], indexed, baseline, len(chosen), args.verbose)
        else:
            outs = [Path(r) / ".mutation-results.json" for r in roots]
            for k, root in enumerate(roots):
                shard = indexed[k :: len(roots)]
                workers.append(
                    _fork_shard(root, shard, baseline, len(chosen), args.verbose, outs[k])
                )
            got = {}
            for pid, out in zip(list(workers), outs, strict=True):
                os.waitpid(pid, 0)
                workers.remove(pid)
                got.update({int(k): v for k, v in json.loads(out.read_text()).items()})
        results = {chosen[n]: state for n, state in got.items()}
    except (KeyboardInterrupt, _Stop):
        print("mutation: stopped; every module restored", file=sys.stderr)
        return 130
    finally:
        for pid in workers:  # each restores its copy in its own `finally`
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        _kill_running()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if args.in_place:
            for m, data in originals.items():
                p = module_path(ROOT, m)
                if p.read_bytes() != data:
                    p.write_bytes(data)
        unchanged = all(module_path(ROOT, m).read_bytes() == d for m, d in originals.items())
        if git_quiet_before:
            unchanged = unchanged and _git_quiet(_paths(modules))
        if not unchanged:
            print("mutation: A MODULE DIFFERS FROM ITS ORIGINAL", file=sys.stderr)
        for root in roots:
            if root != ROOT:
                shutil.rmtree(root, ignore_errors=True)

    seconds = time.monotonic() - t_start
    if earlier is not None:
        print(json.dumps(merge_survivors(earlier, results, seconds)))
        return 0
    print(json.dumps(summary(modules, all_mutants, results, seconds)))
    return 0


def merge_survivors(earlier: dict, results: dict[Mutant, str], seconds: float) -> dict:
    """An earlier run's figures after its survivors ran again: those now killed move over
    (tests were added, none removed, so what was killed stays killed)."""
    now_killed = {m.key for m, state in results.items() if state != "passed"}
    out = dict(earlier)
    out["survived"] = [
        r for r in earlier["survived"] if (r["module"], r["line"], r["mutation"]) not in now_killed
    ]
    out["killed"] = earlier["killed"] + len(now_killed)
    live = out["mutants"] - len(out["equivalent"])
    out["kill_rate"] = round(out["killed"] / live, 4) if live else None
    modules = {}
    for mod, f in earlier["modules"].items():
        n = sum(1 for k in now_killed if k[0] == mod)
        g = {**f, "killed": f["killed"] + n, "survived": f["survived"] - n}
        live = g["mutants"] - g["equivalent"]
        g["kill_rate"] = round(g["killed"] / live, 4) if live else None
        modules[mod] = g
    out["modules"] = modules
    out["survivors_rerun"] = {
        "mutants": len(results),
        "killed": len(now_killed),
        "not_found": len(earlier["survived"]) - len(results),
        "seconds": round(seconds, 1),
    }
    out["seconds"] = round(earlier["seconds"] + seconds, 1)
    return out


def _label(m: Mutant) -> str:
    return f"{m.module}:{m.line}: {m.mutation}"


def _paths(modules: list[str]) -> list[str]:
    return [str(module_path(ROOT, m).relative_to(ROOT)) for m in modules]


def _git_quiet(paths: list[str]) -> bool:
    """`git diff --quiet` on the modules: only what was there before the run may differ."""
    return subprocess.run(["git", "diff", "--quiet", "--", *paths], cwd=ROOT).returncode == 0


def summary(
    modules: list[str], all_mutants: list[Mutant], results: dict[Mutant, str], seconds: float
) -> dict:
    def figures(ms: list[Mutant]) -> dict:
        run = [m for m in ms if m in results]
        equivalent = [m for m in run if m.key in EQUIVALENT]
        killed = [m for m in run if results[m] != "passed" and m.key not in EQUIVALENT]
        survived = [m for m in run if results[m] == "passed" and m.key not in EQUIVALENT]
        live = len(run) - len(equivalent)
        return {
            "mutants": len(run),
            "killed": len(killed),
            "timeouts": sum(results[m] == "timeout" for m in killed),
            "survived": survived,
            "equivalent": equivalent,
            "kill_rate": round(len(killed) / live, 4) if live else None,
        }

    total = figures(list(results))
    keys = {m.key for m in all_mutants}
    stale = [list(k) for k in EQUIVALENT if k[0] in modules and k not in keys]
    per_module = {}
    for mod in modules:
        f = figures([m for m in results if m.module == mod])
        per_module[mod] = {
            "mutants": f["mutants"],
            "killed": f["killed"],
            "survived": len(f["survived"]),
            "equivalent": len(f["equivalent"]),
            "kill_rate": f["kill_rate"],
        }
    return {
        "mutants": total["mutants"],
        "killed": total["killed"],
        "timeouts": total["timeouts"],
        "survived": [_row(m) for m in total["survived"]],
        "equivalent": [
            {**_row(m), "reason": EQUIVALENT[m.key], "killed_anyway": results[m] != "passed"}
            for m in total["equivalent"]
        ],
        "kill_rate": total["kill_rate"],
        "modules": per_module,
        "mutants_in_scope": len(all_mutants),
        "stale_equivalents": stale,
        "seconds": round(seconds, 1),
    }


def rescore(run: dict) -> dict:
    """A run's figures with survivors judged equivalent since moved to `equivalent`."""
    out = dict(run)
    keep, moved = [], []
    for row in run["survived"]:
        key = (row["module"], row["line"], row["mutation"])
        if key in EQUIVALENT:
            moved.append({**row, "reason": EQUIVALENT[key], "killed_anyway": False})
        else:
            keep.append(row)
    out["survived"] = keep
    out["equivalent"] = run["equivalent"] + moved
    live = run["mutants"] - len(out["equivalent"])
    out["kill_rate"] = round(run["killed"] / live, 4) if live else None
    modules = {}
    for mod, f in run["modules"].items():
        n = sum(1 for r in moved if r["module"] == mod)
        g = {**f, "survived": f["survived"] - n, "equivalent": f["equivalent"] + n}
        live = g["mutants"] - g["equivalent"]
        g["kill_rate"] = round(g["killed"] / live, 4) if live else None
        modules[mod] = g
    out["modules"] = modules
    return out


def _row(m: Mutant) -> dict:
    return {"module": m.module, "line": m.line, "mutation": m.mutation}


if __name__ == "__main__":
    sys.exit(main())
