"""The seed's example graphs, runnable: Fig. 2A (components 204A-204J) and Fig. 3A.

Used by the tests (as fixtures), the benchmark, the demo and
`lightpath graph example`. Component behaviour the seed leaves open (what
204C, 204D, 204E, 204G and 204J compute) is chosen here so every kind of the
library appears: 204G is a hash rollup (emits at shutdown), 204J a sort.
"""

from __future__ import annotations

import random
from pathlib import Path

from lightpath.graph.spec import ComponentSpec, DatasetSpec, GraphSpec, flow

FIELDS = ("id", "region", "name", "amount")
REGIONS = ("eu", "us", "apac", "latam", "mea", "anz", "nordics", "iberia")


def write_records(path: str | Path, count: int, *, seed: int = 4, start: int = 0) -> int:
    """Write `count` records (id, region, name, amount) as a TSV file; return bytes written."""
    rng = random.Random(seed)
    syllables = ("ka", "lo", "mi", "ren", "tu", "sa", "vo", "qi", "pe", "dar")
    lines = ["\t".join(FIELDS)]
    for i in range(start, start + count):
        name = "".join(rng.choice(syllables) for _ in range(3))
        lines.append(f"{i}\t{rng.choice(REGIONS)}\t{name}\t{rng.randrange(1000)}")
    data = ("\n".join(lines) + "\n").encode()
    Path(path).write_bytes(data)
    return len(data)


def read_records(path: str | Path) -> list[dict[str, str]]:
    """The records of a tab-separated file with a header line."""
    header, *lines = Path(path).read_text().splitlines()
    fields = header.split("\t")
    return [dict(zip(fields, line.split("\t"), strict=True)) for line in lines]


def _c(id: str, kind: str, **params: str) -> ComponentSpec:
    return ComponentSpec(id=id, kind=kind, params=params)


def fig2a(
    input_path: str | Path,
    output_dir: str | Path,
    *,
    graph_id: str = "fig-2a",
    interface_command: str = "tr a-z A-Z",
) -> GraphSpec:
    """Seed Fig. 2A: dataset 202 through 204A-204J into datasets 206A-206C."""
    out = Path(output_dir)
    return GraphSpec(
        graph_id=graph_id,
        datasets=(
            DatasetSpec("202", str(input_path)),
            DatasetSpec("206A", str(out / "206A.tsv")),
            DatasetSpec("206B", str(out / "206B.tsv")),
            DatasetSpec("206C", str(out / "206C.tsv")),
        ),
        components=(
            _c("204A", "filter", where="amount < 500"),
            _c("204B", "filter", where="region == eu"),
            _c("204C", "reformat", set="path=c", keep="id,region,name,amount,path"),
            _c("204D", "filter", where="amount >= 750"),
            _c("204E", "reformat", keep="id,name,amount", upper="name"),
            _c("204F", "replicate"),
            _c("204G", "hash_rollup", key="region", sum="amount"),
            _c("204H", "interface", command=interface_command),
            _c("204I", "gather"),
            _c("204J", "sort", key="id", numeric="true"),
        ),
        flows=(
            flow("202", "204A"),
            flow("204A:out", "204B"),
            flow("204A:reject", "204C"),
            flow("204B:out", "204E"),
            flow("204B:reject", "204F"),
            flow("204E", "206A"),
            flow("204F", "204G"),
            flow("204F", "204H"),
            flow("204G", "206B"),
            flow("204C", "204D"),
            flow("204D:out", "204I"),
            flow("204H", "204I"),
            flow("204I", "204J"),
            flow("204J", "206C"),
        ),
    )


def fig3a(input_path: str, output_path: str, degree: int, *, graph_id: str = "fig-3a") -> GraphSpec:
    """Seed Fig. 3A: an N-way multifile through three N-way components into an N-way multifile.

    Paths hold "{part}" for the partition number.
    """
    return GraphSpec(
        graph_id=graph_id,
        datasets=(
            DatasetSpec("302", input_path, degree),
            DatasetSpec("306", output_path, degree),
        ),
        components=(
            ComponentSpec("304A", "filter", degree=degree, params={"where": "amount >= 100"}),
            ComponentSpec(
                "304B", "reformat", degree=degree, params={"upper": "name", "set": "seen=1"}
            ),
            ComponentSpec("304C", "sort", degree=degree, params={"key": "id", "numeric": "true"}),
        ),
        flows=(
            flow("302", "304A"),
            flow("304A:out", "304B"),
            flow("304B", "304C"),
            flow("304C", "306"),
        ),
    )
