"""Fabrics of seed 002's figures, shared by the switched tests."""

from __future__ import annotations

from lightpath.domain.switched import FIG18_FABRIC, SwitchedFabricConfig, build_fabric

# Fig. 6: four groups of four processors (1-D) on one switch.
FIG6 = SwitchedFabricConfig(
    group_shape=(4,), cluster_rows=1, cluster_cols=4, planes=1, tier0_down_ports=8, tier0_up_ports=0
)
# Fig. 7: groups of five, three per tier-0 switch, four switches coupled directly.
FIG7 = SwitchedFabricConfig(
    group_shape=(5,),
    cluster_rows=4,
    cluster_cols=3,
    planes=1,
    tier0_down_ports=6,
    tier0_up_ports=3,
    tier0_mesh_links=1,
)
# ¶47-48, Fig. 15: one plane, 24 groups of four per 64-port tier-0 switch
# (48 down, 16 up), two tier-0 switches under a tier-1 switch.
FIG15 = SwitchedFabricConfig(
    group_shape=(4,),
    cluster_rows=2,
    cluster_cols=24,
    planes=1,
    tier0_down_ports=48,
    tier0_up_ports=16,
    tier1_switches=1,
    tier1_ports=64,
)
# Fig. 9-12: 3x3 groups in a 2x2 cluster with row and column switches; three
# ports face each neighbour (Fig. 13), so 9 planes per dimension.
FIG11 = SwitchedFabricConfig(
    group_shape=(3, 3),
    cluster_rows=2,
    cluster_cols=2,
    planes=9,
    tier0_down_ports=48,
    tier0_up_ports=16,
    tier1_switches=2,
    tier1_ports=64,
)
# ¶46-52, Fig. 14-18: 24x24 groups of 4x4 (9,216 processors), 12 planes, 48/16 tier-0.
FIG18 = FIG18_FABRIC
# Small enough for property tests: 3x3 groups of 2x2, 2 lanes, scarce uplinks.
SMALL = SwitchedFabricConfig(
    group_shape=(2, 2),
    cluster_rows=3,
    cluster_cols=3,
    planes=4,
    tier0_down_ports=6,
    tier0_up_ports=2,
    tier1_switches=1,
    tier1_ports=8,
)


def fabric(config: SwitchedFabricConfig):
    return build_fabric(config)
