"""docs/ocs_southbound.md's worked K = 2 example is exact (issue 34): the test reads the
`southbound-example` block out of the doc and checks every line against the code: the
fabric's arithmetic (F_k, axis_offset, the port map, the 1xK bank inputs) and the
batches the manager's driver sends for the wire and the release it describes."""

from __future__ import annotations

import re
from pathlib import Path

from lightpath.domain.torus import FIRST, SECOND, Fabric, FabricConfig, dim_name, parse_shape
from lightpath_services.ocs_manager.agent_driver import batches
from lightpath_services.ocs_manager.wiring import SlicePlacement, release_change, wire_change

DOC = Path(__file__).resolve().parents[2] / "docs" / "ocs_southbound.md"


def example() -> list[str]:
    text = DOC.read_text()
    m = re.search(r"^```southbound-example\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/ocs_southbound.md has no southbound-example block"
    return [line.strip() for line in m.group(1).splitlines() if line.strip()]


def ints(raw: str) -> list[int]:
    return [int(v) for v in raw.split()]


def test_the_k2_example_in_the_doc_is_what_the_code_does():
    lines = example()
    m = re.fullmatch(r"fabric: block_shape (\S+), blocks (\d+), K (\d+), radix (\d+)", lines[0])
    assert m, lines[0]
    fabric = Fabric.build(
        FabricConfig(parse_shape(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)))
    )
    assert fabric.k == 2  # the example the issue asks for: K = 2, with its 1xK banks
    dims = [dim_name(d) for d in range(fabric.dims)]
    expected: dict[str, tuple[list[tuple[int, int]], dict[int, int]]] = {}
    placement = None
    checked = set()
    for line in lines[1:]:
        if line.startswith("F_k:"):
            assert tuple(ints(line.removeprefix("F_k:"))) == fabric.first_ends
        elif line.startswith("axis_offset:"):
            assert tuple(ints(line.removeprefix("axis_offset:"))) == fabric.axis_offset
        elif m := re.fullmatch(r"port map: (otm-\S+) is (otm-\d+) input (\d+)", line):
            block, d, a = fabric.parse_one_to_many_id(m.group(1)) or (-1, -1, -1)
            assert block >= 0, line
            assert f"otm-{block}" == m.group(2), line
            assert fabric.axis_offset[d] + a == int(m.group(3)), line
            entry = fabric.port_map_entry(block, d, a, SECOND)
            assert entry.one_to_many == fabric.one_to_many_index(block, d, a)
            assert entry.one_to_many == block * fabric.total_axes + int(m.group(3)), line
        elif m := re.fullmatch(
            r"port map: block (\d+) (first|second) end \((\w), axis (\d+)\) is (.*)", line
        ):
            block, end = int(m.group(1)), FIRST if m.group(2) == "first" else SECOND
            d, a = dims.index(m.group(3)), int(m.group(4))
            entry = fabric.port_map_entry(block, d, a, end)
            said = [
                (sid, int(port)) for sid, port in re.findall(r"(ocs-\S+) port (\d+)", m.group(5))
            ]
            assert [(fabric.ocs_ids[o], p) for o, p in entry.ports] == said, line
        elif m := re.fullmatch(r"wire: (\S+) grid (\S+) wrap blocks ([\d ]+)", line):
            grid = parse_shape(m.group(2))
            placement = SlicePlacement(
                m.group(1), grid, tuple(ints(m.group(3))), tuple(True for _ in grid)
            )
        elif m := re.fullmatch(r"((?:ocs-\S+ ?)+): connect \((\d+), (\d+)\)", line):
            for sid in m.group(1).split():
                expected.setdefault(sid, ([], {}))[0].append((int(m.group(2)), int(m.group(3))))
        elif m := re.fullmatch(r"(otm-\d+): set_outputs (.*)", line):
            for part in m.group(2).split(";"):
                inputs, _, output = part.partition("->")
                for i in ints(inputs):
                    expected.setdefault(m.group(1), ([], {}))[1][i] = int(output)
        elif line.startswith("release:"):
            checked.add("release")
        else:
            raise AssertionError(f"a line the test does not know: {line!r}")
        checked.add(line.split(":")[0])
    assert placement is not None and "port map" in checked and "release" in checked

    sent = batches(fabric, wire_change(fabric, placement))
    got = {
        sid: (
            sorted((p.port_a, p.port_b) for p in r.connect),
            {o.input: o.output for o in r.set_outputs},
        )
        for sid, r in sent.items()
    }
    assert got == {sid: (sorted(c), o) for sid, (c, o) in expected.items()}
    assert not any(r.disconnect for r in sent.values())
    assert all(not (r.connect and r.set_outputs) for r in sent.values())

    # the release: the same switches, the inverse of each batch
    undone = batches(fabric, release_change(fabric, placement))
    assert set(undone) == set(sent)
    for sid, r in undone.items():
        assert sorted((p.port_a, p.port_b) for p in r.disconnect) == got[sid][0], sid
        assert not r.connect, sid
        assert {o.input for o in r.set_outputs} == set(got[sid][1]), sid
        assert not any(o.HasField("output") for o in r.set_outputs), sid
