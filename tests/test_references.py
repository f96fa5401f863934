"""Every reference in the repository resolves inside it (issue 31): a paragraph, figure,
section or claim of a source design ("seed 000 ¶43", "Fig. 2A", "seed §2.2.1") has its
row in docs/sources.md, a requirement id (`CS-4`, `OCS-5`) its entry in
docs/requirements.md, a project issue ("issue 28") its row in docs/history.md; and
nothing points at a document a clone does not have (the designs' directory, SPEC.md).

The tree is read once; each failure names the reference and the files that cite it.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SOURCES = DOCS / "sources.md"
REQUIREMENTS = DOCS / "requirements.md"
HISTORY = DOCS / "history.md"

SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "dist",
}
SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".gz", ".tgz", ".zip", ".whl", ".pyc"}
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
# Files whose job is to look for the outside references (they spell them as strings).
CHECKERS = {THIS, "tests/test_readme.py"}

# The sibling directory of the designs, by a relative or an absolute path, and the
# specification they came with.
OUTSIDE = re.compile(
    r"\.\./shared\b|(?<![\w.])/\w+/shared\b|\bSPEC\.md\b|\bSPEC\s*§\s?\d*|\bSPEC\s+[A-Z]+-\d"
)

# Which design a bare "¶52" belongs to when its comment names none: the one the
# file's subject comes from (first match of its path wins).
SEED_OF_PATH = [
    ("switched", "002"),
    ("rings", "002"),
    ("core_broker", "001"),
    ("cores", "001"),
    ("agg", "003"),
    ("graph", "004"),
    ("folding", "004"),
]
DEFAULT_SEED = "000"
# Single references that both guesses get wrong (a switched section far below the
# seed 002 it names): (file, reference) -> seed.
SEED_OF_REFERENCE = {
    ("protos/lightpath/v1/ocs_manager.proto", "Fig. 7"): "002",
    ("protos/lightpath/v1/ocs_manager.proto", "¶54"): "002",
    ("lightpath/v1/ocs_manager_pb2.pyi", "Fig. 7"): "002",
    ("lightpath/v1/ocs_manager_pb2.pyi", "¶54"): "002",
    ("services/lightpath_services/workload_scheduler/planner.py", "¶57"): "002",
}

SEED_NAME = re.compile(r"\bseeds?\s+(00[0-4])\b|\b(00[0-4])(?:'s)?\s+(?=Fig)", re.I)
PARAGRAPH = re.compile(r"¶\s?(\d+)(?:\s?[-–]\s?(\d+))?")
FIGURE = re.compile(
    r"\bFig(?:ure)?s?\.?\s?(\d+)([A-Z]?)(?:\s?[-–]\s?(\d+)[A-Z]?)?(?:\s?/\s?(\d+[A-Z]?))?"
)
SECTION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
CLAIM = re.compile(r"\bclaims?\s+(\d+)")
# A seed named up to this many lines before a reference (or later on its line, "Fig. 2A
# of seed 004") is the one it cites; beyond, the file's subject decides.
WINDOW_LINES = 20
ISSUE = re.compile(r"\bissues?\s+#?(\d+)\b", re.I)
SPEC_SECTIONS = re.compile(r"\bSPEC(?:\.md)?\s*(?:§\s?\d+(?:\.\d+)*(?:,\s*§\s?\d+(?:\.\d+)*)*)?")


def _text_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for folder, dirs, names in os.walk(ROOT):
        # pruned in place, so a virtualenv or a cache is never walked
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(folder, name)
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in SKIP_SUFFIXES or rel == THIS or name == ".git":
                continue
            try:
                files[rel] = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
    return files


FILES = _text_files()


def _default_seed(rel: str) -> str:
    return next((seed for part, seed in SEED_OF_PATH if part in rel), DEFAULT_SEED)


def _spans(first: int, last: int | None) -> list[int]:
    """The numbers of "¶52-55" (a reversed or implausibly long range: its first only)."""
    if last is None or last < first or last - first > 60:
        return [first]
    return list(range(first, last + 1))


def seed_references(rel: str, text: str) -> list[tuple[str, str]]:
    """(seed, "¶43" | "Fig. 2A" | "§2.2.1" | "claim 8") for every reference in `text`."""
    text = SPEC_SECTIONS.sub(lambda m: " " * len(m.group()), text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    names = [(m.start(), m.group(1) or m.group(2)) for m in SEED_NAME.finditer(text)]
    fallback = _default_seed(rel)

    def seed_at(pos: int) -> str:
        line = bisect.bisect_right(line_starts, pos) - 1
        since = line_starts[max(0, line - WINDOW_LINES)]
        line_end = line_starts[line + 1] if line + 1 < len(line_starts) else len(text)
        before = [seed for start, seed in names if since <= start < pos]
        after = [seed for start, seed in names if pos < start < line_end]
        return before[-1] if before else after[0] if after else fallback

    found: list[tuple[str, str]] = []
    for m in PARAGRAPH.finditer(text):
        last = int(m.group(2)) if m.group(2) else None
        for n in _spans(int(m.group(1)), last):
            found.append((seed_at(m.start()), f"¶{n}"))
    for m in FIGURE.finditer(text):
        seed = seed_at(m.start())
        found.append((seed, f"Fig. {m.group(1)}{m.group(2)}"))
        last = int(m.group(3)) if m.group(3) else None
        for n in _spans(int(m.group(1)), last)[1:]:
            found.append((seed, f"Fig. {n}"))
        if m.group(4):
            found.append((seed, f"Fig. {m.group(4)}"))
    for m in SECTION.finditer(text):
        found.append((seed_at(m.start()), f"§{m.group(1)}"))
    for m in CLAIM.finditer(text):
        if "seed" in text[max(0, m.start() - 12) : m.start()]:
            found.append((seed_at(m.start()), f"claim {m.group(1)}"))
    return [(SEED_OF_REFERENCE.get((rel, ref), seed), ref) for seed, ref in found]


def _rows(path: Path) -> dict[str, set[str]]:
    """docs/sources.md's rows: seed -> the references its table covers. A row's first
    cell is a reference ("¶43", "Fig. 2A", "§2.2.1", "claim 8") or a range ("¶52-55",
    "Fig. 9-11"), under a heading naming its seed ("## Seed 000: ...")."""
    covered: dict[str, set[str]] = defaultdict(set)
    seed = None
    for line in path.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#+\s+Seed\s+(00\d)", line)
        if heading:
            seed = heading.group(1)
            continue
        cell = re.match(r"\|\s*([^|]+?)\s*\|", line)
        if seed is None or cell is None:
            continue
        key = cell.group(1)
        if m := re.fullmatch(r"¶(\d+)(?:[-–](\d+))?", key):
            last = int(m.group(2) or m.group(1))
            covered[seed] |= {f"¶{n}" for n in range(int(m.group(1)), last + 1)}
        elif m := re.fullmatch(r"Fig\. (\d+)([A-Z]?)(?:[-–](\d+))?", key):
            covered[seed].add(f"Fig. {m.group(1)}{m.group(2)}")
            for n in range(int(m.group(1)), int(m.group(3) or m.group(1)) + 1):
                covered[seed].add(f"Fig. {n}")
        elif re.fullmatch(r"§[\d.]+|claim \d+", key):
            covered[seed].add(key)
    return covered


def _families() -> set[str]:
    return set(re.findall(r"^## .*\(([A-Z]+)\)", REQUIREMENTS.read_text(), re.M))


def _requirement_ids(text: str, families: set[str]) -> set[str]:
    family = "|".join(sorted(families, key=len, reverse=True))
    ids = set(re.findall(rf"\b(?:{family})-\d+\b", text))
    # "CS-1 … CS-6" (or "WS-2…4") cites the ids between as well
    for m in re.finditer(rf"\b({family})-(\d+)\s*(?:…|\.\.\.)\s*(?:\1-)?(\d+)\b", text):
        ids |= {f"{m.group(1)}-{n}" for n in range(int(m.group(2)), int(m.group(3)) + 1)}
    return ids


def _missing(cited: dict[str, set[str]]) -> str:
    return "\n".join(
        f"  {ref}: cited in {', '.join(sorted(paths))}" for ref, paths in sorted(cited.items())
    )


def lacking_source_rows(files: dict[str, str]) -> dict[str, set[str]]:
    """For each citation docs/sources.md lacks ("seed 000 ¶43"), the files citing it."""
    covered = _rows(SOURCES)
    lacking: dict[str, set[str]] = defaultdict(set)
    for rel, text in files.items():
        if rel == "docs/sources.md":
            continue  # the rows themselves, under their seeds' headings
        for seed, ref in seed_references(rel, text):
            if ref not in covered[seed]:
                lacking[f"seed {seed} {ref}"].add(rel)
    return lacking


def lacking_requirement_entries(files: dict[str, str]) -> dict[str, set[str]]:
    families = _families()
    defined = set(re.findall(r"\*\*([A-Z]+-\d+)\*\*", REQUIREMENTS.read_text()))
    lacking: dict[str, set[str]] = defaultdict(set)
    for rel, text in files.items():
        for rid in _requirement_ids(text, families) - defined:
            lacking[rid].add(rel)
    return lacking


def lacking_history_rows(files: dict[str, str]) -> dict[str, set[str]]:
    rows = set(re.findall(r"^\|\s*(\d+)\s*\|", HISTORY.read_text(), re.M))
    lacking: dict[str, set[str]] = defaultdict(set)
    for rel, text in files.items():
        for m in ISSUE.finditer(text):
            if m.group(1) not in rows:
                lacking[f"issue {m.group(1)}"].add(rel)
    return lacking


def outside_references(files: dict[str, str]) -> dict[str, set[str]]:
    """The pointer -> "file:line" for every pointer at a document a clone lacks."""
    found: dict[str, set[str]] = defaultdict(set)
    for rel, text in files.items():
        if rel in CHECKERS:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in OUTSIDE.finditer(line):
                found[m.group()].add(f"{rel}:{number}")
    return found


def test_every_seed_reference_has_its_row_in_docs_sources():
    lacking = lacking_source_rows(FILES)
    assert not lacking, (
        "these references to the source designs have no row in docs/sources.md "
        "(add one, in our own words, under the seed's heading):\n" + _missing(lacking)
    )


def test_every_requirement_id_has_its_entry_in_docs_requirements():
    assert {"CS", "WS", "OCS", "SW", "CB", "GF", "AG", "X"} <= _families()
    lacking = lacking_requirement_entries(FILES)
    assert not lacking, (
        "these requirement ids have no **ID** entry in docs/requirements.md:\n" + _missing(lacking)
    )


def test_every_issue_number_has_its_row_in_docs_history():
    lacking = lacking_history_rows(FILES)
    assert not lacking, (
        "these project issues have no row in docs/history.md (number, title, what it "
        "asked, where it lives):\n" + _missing(lacking)
    )


def test_nothing_points_outside_the_repository():
    found = outside_references(FILES)
    assert not found, (
        "these point at documents a clone does not have (say it here, or cite "
        "docs/requirements.md / docs/sources.md):\n" + _missing(found)
    )


@pytest.mark.parametrize(
    ("rel", "text", "expected"),
    [
        ("services/x.py", "(seed 002 ¶28-30, ¶38)", {("002", f"¶{n}") for n in (28, 29, 30, 38)}),
        ("services/lightpath_services/core_broker/d.py", "priority (CB-3, ¶34)", {("001", "¶34")}),
        (
            "tests/x.py",
            '"""seed 001 Fig. 2-3."""' + "\n" * 21 + "# ¶47, Fig. 2A",
            {
                ("001", "Fig. 2"),
                ("001", "Fig. 3"),
                ("000", "¶47"),
                ("000", "Fig. 2A"),
            },
        ),
        (
            "lightpath/graph/f.py",
            "(SPEC §7; seed §2.2.1, seed claim 8)",
            {
                ("004", "§2.2.1"),
                ("004", "claim 8"),
            },
        ),
        (
            "docs/a.md",
            "([seed 003](requirements.md)) Fig. 8/9",
            {("003", "Fig. 8"), ("003", "Fig. 9")},
        ),
    ],
)
def test_references_are_read_as_they_are_spelled(rel, text, expected):
    assert set(seed_references(rel, text)) == expected


def test_each_check_names_the_reference_and_the_file_that_lacks_a_row():
    new = {
        "services/new.py": "# seed 002 ¶9999 and Fig. 77; issue 9999; CS-999 … CS-1000\n",
        "docs/new.md": "see ../shared/seeds and SPEC.md §3 (SPEC §7)\n",
        "docs/abs.md": "the designs in /srv/shared/seeds; deploy/kubernetes/shared is ours\n",
        "tests/ok.py": "# seed 000 ¶43, Fig. 2; issue 28; CS-4\n",
    }
    assert lacking_source_rows(new) == {
        "seed 002 ¶9999": {"services/new.py"},
        "seed 002 Fig. 77": {"services/new.py"},
    }
    assert lacking_history_rows(new) == {"issue 9999": {"services/new.py"}}
    assert lacking_requirement_entries(new) == {
        "CS-999": {"services/new.py"},
        "CS-1000": {"services/new.py"},
    }
    assert outside_references(new) == {
        "../shared": {"docs/new.md:1"},
        "/srv/shared": {"docs/abs.md:1"},
        "SPEC.md": {"docs/new.md:1"},
        "SPEC §7": {"docs/new.md:1"},
    }
    message = _missing(lacking_history_rows(new))
    assert message == "  issue 9999: cited in services/new.py"


def test_requirement_ids_are_read_as_they_are_spelled():
    families = _families()
    assert _requirement_ids("WS-2…4, CS-1 … CS-3 and AG-14", families) == {
        "WS-2",
        "WS-3",
        "WS-4",
        "CS-1",
        "CS-2",
        "CS-3",
        "AG-14",
    }
    # other dashes with numbers are not requirement ids
    assert _requirement_ids("SHA-256, UTF-8, P-256, TLS-1", families) == set()
