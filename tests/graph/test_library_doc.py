"""docs/graphs.md lists every kind of the component library with its ports and
folding exactly as lightpath/graph/kinds.py gives them to the planner (issue 19:
the port names were documented nowhere but the code)."""

from __future__ import annotations

from pathlib import Path

from lightpath.graph.kinds import LIBRARY
from lightpath.graph.spec import Folding

DOC = Path(__file__).resolve().parents[2] / "docs" / "graphs.md"
FOLDING = {
    Folding.ROOT_OR_INTERIOR: "root or interior",
    Folding.ROOT_ONLY: "root only",
    Folding.NOT_FOLDABLE: "not foldable",
}


def ports(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{p}`" for p in names) or "-"


def library_rows() -> dict[str, list[str]]:
    """The doc's table: kind -> its cells."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0].strip("`") in LIBRARY:
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_library_kind_is_listed_with_its_ports_and_folding():
    rows = library_rows()
    assert sorted(rows) == sorted(LIBRARY)
    for kind, info in LIBRARY.items():
        _, inputs, outputs, folding, summary = rows[kind]
        assert inputs == ports(info.inputs), kind
        assert outputs == ports(info.outputs), kind
        assert folding.startswith(FOLDING[info.folding]), kind
        assert ("<id>.request" in folding) == info.split, kind
        assert summary == info.summary, kind


def test_the_filter_row_names_its_reject_port():
    # the port an outside client could not find (issue 19)
    assert library_rows()["filter"][2] == "`out`, `reject`"
