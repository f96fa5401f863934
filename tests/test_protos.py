"""The committed stubs in lightpath/v1 are what scripts/gen_protos.py makes of protos/."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gen():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_are_fresh():
    stale = _gen().stale_files()
    assert stale == [], f"stale stubs {stale}: run `python3 dev.py protos` and commit"


def test_a_proto_change_makes_the_stubs_stale(tmp_path):
    for part in ("protos", "lightpath/v1"):
        shutil.copytree(ROOT / part, tmp_path / part)
    with (tmp_path / "protos/lightpath/v1/common.proto").open("a") as f:
        f.write("\nmessage AddedInTest { string x = 1; }\n")
    stale = _gen().stale_files(tmp_path)
    assert "common_pb2.py" in stale and "common_pb2.pyi" in stale
    assert "ocs_manager_pb2.py" not in stale


def test_every_service_proto_declares_get_info():
    from lightpath.v1 import (
        agg_switch_pb2,
        cell_scheduler_pb2,
        core_broker_pb2,
        ocs_manager_pb2,
        workload_scheduler_pb2,
    )

    for module in (
        agg_switch_pb2,
        cell_scheduler_pb2,
        core_broker_pb2,
        ocs_manager_pb2,
        workload_scheduler_pb2,
    ):
        (service,) = module.DESCRIPTOR.services_by_name.values()
        assert service.full_name.startswith("lightpath.v1.")
        assert (
            service.methods_by_name["GetInfo"].output_type.full_name == "lightpath.v1.ServiceInfo"
        )


def test_the_shipped_google_rpc_protos_are_the_ones_the_errors_use(tmp_path):
    """Issue 19: a client built from protos/ alone can decode the error details — the
    shipped google.rpc files compile and define what the services put in the trailers."""
    import subprocess
    import sys

    import grpc_tools
    from google.protobuf import descriptor_pb2
    from google.rpc import error_details_pb2, status_pb2

    out = tmp_path / "set.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
            f"--descriptor_set_out={out}",
            "google/rpc/status.proto",
            "google/rpc/error_details.proto",
        ],
        check=True,
    )
    shipped = {
        f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    }

    def fields(f: descriptor_pb2.FileDescriptorProto) -> set[tuple[str, str, int, int, str]]:
        return {
            (m.name, x.name, x.number, x.type, x.type_name) for m in f.message_type for x in m.field
        }

    for module in (status_pb2, error_details_pb2):
        used = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(used)
        assert fields(shipped[module.DESCRIPTOR.name]) == fields(used), module.DESCRIPTOR.name
    for name in ("status.proto", "error_details.proto"):
        assert (
            "Licensed under the Apache License, Version 2.0"
            in (ROOT / "protos" / "google" / "rpc" / name).read_text()
        )
