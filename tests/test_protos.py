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
