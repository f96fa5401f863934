"""In-network aggregation, the parts the switches (services/lightpath_services/agg_switch) and
the compute nodes share:

    maths.py  the arithmetic: dtypes, ops, order policies, reductions, folds,
              the timeout aggregation node's work (pure, numpy only)
    wire.py   the AggChunk codec of the data path (zero-copy decode, shared-
              memory references, the ShmHello handshake's encodings)
    shm.py    shared memory between aggregation peers on one host
    node.py   the compute-node SDK: `ComputeNode`, `aggregate_all`,
              `local_node_credentials`

Imports run maths, shm → wire → node; only node.py uses gRPC. This module
imports nothing, so a switch that needs the maths does not load the SDK.
"""
