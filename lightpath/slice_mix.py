"""The slice mix a real TPU v4 superpod served, as a table to draw workloads from.

`lightpath/data/tpu_v4_slice_mix.json` is a copy of Table 2 of Jouppi et al.,
"TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning with
Hardware Support for Embeddings" (ISCA 2023): the share of slices by shape on one
day in November 2022 on a 4,096-chip superpod of 4x4x4 blocks; `twisted` marks the
slices wired as a twisted torus. bench/slice_mix.py and the simulator draw from it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "data" / "tpu_v4_slice_mix.json"


@dataclass(frozen=True)
class MixShape:
    chips: tuple[int, ...]
    share_pct: float
    twisted: bool = False

    @property
    def name(self) -> str:
        return "x".join(map(str, self.chips)) + (" twisted" if self.twisted else "")

    @property
    def chip_count(self) -> int:
        out = 1
        for c in self.chips:
            out *= c
        return out


def load(path: Path = TABLE) -> tuple[str, tuple[MixShape, ...]]:
    """(source, shapes) of a slice-mix table."""
    raw = json.loads(path.read_text())
    shapes = tuple(
        MixShape(tuple(s["chips"]), float(s["share_pct"]), bool(s.get("twisted", False)))
        for s in raw["shapes"]
    )
    return raw["source"], shapes


def drawer(shapes: tuple[MixShape, ...], seed: int):
    """An endless draw of shapes weighted by their share (same seed, same draw)."""
    rng = random.Random(seed)
    weights = [s.share_pct for s in shapes]
    while True:
        yield rng.choices(shapes, weights)[0]
