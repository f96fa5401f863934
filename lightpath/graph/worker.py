"""One process of a graph run: `python -m lightpath.graph.worker JOB.json`.

Runs one instance of one folded set with the FoldedExecutor. The job file
names the graph spec (binary lightpath.v1.GraphSpec), the set's members, its
channels (inherited pipe descriptors or spill files between phases), the
checkpoint settings, and a control descriptor on which the worker reports
JSON lines: ready, checkpoint, done (with its metrics) or error (naming the
component).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    control = os.fdopen(job["control_fd"], "w", buffering=1)

    def send(event: str, **fields: Any) -> None:
        control.write(json.dumps({"event": event, **fields}) + "\n")

    from lightpath.graph.executor import (
        ChannelIn,
        CheckpointStore,
        ComponentFailure,
        FoldedExecutor,
    )

    try:
        from lightpath.graph.expand import expand
        from lightpath.graph.spec import from_proto
        from lightpath.v1 import graph_pb2

        spec = from_proto(graph_pb2.GraphSpec.FromString(Path(job["spec"]).read_bytes()))
        graph = expand(spec)
        channels_in = [ChannelIn(flow, fd, src) for flow, fd, src in job["channels_in"]]
        for flow, path, src in job["spill_in"]:
            channels_in.append(ChannelIn(flow, os.open(path, os.O_RDONLY), src))
        channels_out: dict[int, list[int]] = {
            int(k): list(v) for k, v in job["channels_out"].items()
        }
        for k, paths in job["spill_out"].items():
            channels_out[int(k)] = [
                os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in paths
            ]
        checkpoints = (
            CheckpointStore(job["checkpoint_dir"], job["set_id"], job["instance"])
            if job.get("checkpoint_dir")
            else None
        )
        executor = FoldedExecutor(
            graph,
            job["members"],
            set_id=job["set_id"],
            instance=job["instance"],
            degree=job["degree"],
            channels_in=channels_in,
            channels_out=channels_out,
            checkpoints=checkpoints,
            checkpoint_every=job.get("checkpoint_every", 0),
            resume_from=job.get("resume_from"),
            sample_interval=job.get("sample_interval", 0.005),
            channel_batch=job.get("channel_batch", 1024),
            on_ready=lambda: send("ready", at=time.time()),
            on_checkpoint=lambda k: send("checkpoint", id=k),
        )
        report = executor.run()
    except ComponentFailure as exc:
        send("error", component=exc.component, message=exc.message)
        return 1
    except Exception as exc:
        send("error", component="", message=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return 2
    send("done", report=report.to_dict())
    return 0


if __name__ == "__main__":
    code = main()
    # The run is reported: leave without tearing down the heap (a sort's
    # records, say), which costs time and changes nothing, as
    # multiprocessing's children do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
