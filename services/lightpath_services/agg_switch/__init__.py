"""agg_switch: one switch of an in-network aggregation tree with timeouts and bypass entries (AG-1 … AG-14).

    topology.py   the tree (AG-1): validation, preorder, routing, hops, link costs
    command.py    commands (AG-2) and management decisions: the timeout aggregation
                  node (AG-10), predicted stragglers and bitmaps (AG-9), each switch's plan
    switch.py     SwitchCore: one switch as a pure state machine — slots (AG-13),
                  thresholds and bypass entries (AG-3 … AG-5), the timeout aggregation
                  node's work (AG-6, AG-7), deadlines (AG-11), the parameter server (AG-12)
    dataplane.py  SwitchCore driven by gRPC streams, asyncio timers and Redis; per peer,
                  chunks by shared-memory reference (co-located) or as bytes
    transport.py  which shared-memory buffers a command holds here, and when they go back
    store.py      Redis: topology, endpoints, commands, reports, history, parameters
    convert.py    protobuf ⇄ domain
    server.py     the servicer (management and data path)

The arithmetic (AG-8), the wire codec (AG-14) and the shared-memory domain
live in lightpath.aggregation (maths, wire and shm), shared with the
compute-node SDK (lightpath.aggregation.node), since a compute node may be
the timeout aggregation node.
"""
