"""Compute nodes of in-network aggregation, written with the SDK: start a command over
the local stack's tree, have each of its compute nodes contribute a vector as itself, and
check the sum every node gets back.

    lightpath up &                        # its tree: root over sub-1 [n1 n2 n3], sub-2 [n4 n5]
    python examples/agg_compute_nodes.py [COMMAND_ID]

Each node presents its own certificate (the switches take a node's chunks only from that
node): `local_node_credentials` has the local stack's CA issue them. On a real cluster
each node is its own process with the certificate it was given:
`ComputeNode("n1", switch_address, credentials=Credentials.from_files(ca, cert, key))`.
The test suite runs this script against a real stack (tests/test_day_one_docs.py).
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import numpy as np

from lightpath.aggregation.node import ComputeNode, local_node_credentials
from lightpath.sdk.aggregation import AsyncAggregation
from lightpath.stack import endpoint

NODES = ["n1", "n2", "n3", "n4", "n5"]


async def main(command_id: str) -> int:
    async with AsyncAggregation() as agg:  # the stack's root switch, as the operator
        cmd = await agg.start(command_id, NODES, 1 << 16, dtype="float32", deadline=30)
        print(
            f"started {cmd.command_id}: {len(NODES)} nodes x {cmd.length} float32, {cmd.chunks} chunks"
        )
    creds = await local_node_credentials(NODES)
    root = endpoint("agg-root", "LIGHTPATH_AGG_ADDR")
    nodes = [ComputeNode(n, root, credentials=creds[n]) for n in NODES]
    try:
        # node k contributes a vector of k: every element of the sum is 1 + 2 + ... + 5
        results = await asyncio.gather(
            *(
                node.aggregate(command_id, np.full(1 << 16, k, np.float32))
                for k, node in enumerate(nodes, 1)
            )
        )
    finally:
        for node in nodes:
            await node.close()
    want = sum(range(1, len(NODES) + 1))
    for r in results:
        print(
            f"{r.node_id}: result[0] = {r.values[0]:g} in {r.seconds:.2f} s, shared memory {r.shared_memory}"
        )
    ok = all(np.all(r.values == want) for r in results)
    print("every node got the sum" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else f"example-{uuid.uuid4().hex[:8]}"))
    )
