"""The seeds' behaviour that more than one service needs, as pure code.

No gRPC, no Redis, no asyncio, no service: services import this package, it
imports none of them (tests/test_architecture.py holds it to that). A job spec
arrives as a protobuf message, so `jobs` reads lightpath.v1 messages.

    ids             what an id may be (X-5)
    torus           an OCS torus fabric: dimensions, blocks, OCS and port map (OCS-*)
    switched        a switched fabric: groups, tier-0/tier-1 switches, links (seed 002)
    switched_rings  rings on a switched fabric: tiles, degrees, ring search (SW-*)
    blocks          a pod's building blocks and their node types (PodFabric)
    slices          slice demands, slice jobs, their states and policies
    rings           rings of a torus slice, one set per parallelism axis (WS-10)
    jobs            a JobSpec → the normalised request, priorities (WS-2)
"""
