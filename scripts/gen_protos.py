#!/usr/bin/env python3
"""Regenerate the Python stubs in lightpath/v1 from protos/lightpath/v1.

    python scripts/gen_protos.py            # rewrite lightpath/v1/*_pb2*.py[i]
    python scripts/gen_protos.py --check    # exit 1 if the committed stubs are stale

Needs the [dev] extras (grpcio-tools and mypy-protobuf, pinned in
pyproject.toml: the generated code depends on their exact versions).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path("lightpath") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    scripts = Path(sysconfig.get_path("scripts"))
    found = shutil.which(name, path=str(scripts)) or shutil.which(name)
    if not found:
        sys.exit(f"gen_protos: {name} not found; install the dev extras (pip install -e .[dev])")
    return found


def generate(out_dir: Path, root: Path = ROOT) -> list[Path]:
    """Run protoc over every .proto of the package under `root`; return the files written."""
    import grpc_tools

    proto_root = root / "protos"
    protos = sorted(str(p.relative_to(proto_root)) for p in (proto_root / PACKAGE).glob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"gen_protos: protoc failed:\n{done.stderr}")
    return sorted(p for p in (out_dir / PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def stale_files(root: Path = ROOT) -> list[str]:
    """Names of generated files that differ from, or are missing in, lightpath/v1 under `root`."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp), root)}
        committed = {
            p.name: p for p in (root / PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES)
        }
        names = sorted(set(fresh) | set(committed))
        return [
            n
            for n in names
            if n not in fresh
            or n not in committed
            or not filecmp.cmp(fresh[n], committed[n], shallow=False)
        ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated stubs: " + ", ".join(stale) + "; run `python3 dev.py protos`")
            return 1
        print("generated stubs are up to date")
        return 0
    target = ROOT / PACKAGE
    for old in target.iterdir():
        if old.name.endswith(GENERATED_SUFFIXES):
            old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copy2(path, target / path.name)
            print(f"wrote {PACKAGE / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
