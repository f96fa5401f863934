"""Two distributions (issue 31): `lightpath` (the root: SDK, CLI, domain, stubs) installs
without the servers, and `lightpath-services` (services/) holds them, requiring the client
at the same version. Both wheels are built here offline (no index, no build isolation:
setuptools from the dev extra), from copies of the sources so the tree gets no build/."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CLIENT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVER = tomllib.loads((ROOT / "services" / "pyproject.toml").read_text())["project"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
# What only the servers import: a client install must not pull these in.
SERVER_ONLY = {canonicalize_name(Requirement(d).name) for d in SERVER["dependencies"]} - {
    canonicalize_name(CLIENT["name"])
}
# The modules of those distributions (and the servers' package) a client must not need.
SERVER_MODULES = [
    "lightpath_services",
    "starlette",
    "uvicorn",
    "ncclient",
    "matplotlib",
    "pydantic_settings",
    "hiredis",
    "grpc_reflection",
    "prometheus_client",
]


def _wheel(tmp: Path, project: Path, package: str, extra: tuple[str, ...] = ()) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *extra):
        shutil.copy2(project / name, src / name)
    shutil.copytree(project / package, src / package, ignore=IGNORE)
    out = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


def _metadata(wheel: Path) -> tuple[list[str], object]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, Parser().parsestr(z.read(meta).decode())


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory) -> Path:
    return _wheel(tmp_path_factory.mktemp("client"), ROOT, "lightpath")


@pytest.fixture(scope="module")
def server_wheel(tmp_path_factory) -> Path:
    return _wheel(tmp_path_factory.mktemp("server"), ROOT / "services", "lightpath_services")


def test_the_client_wheel_holds_no_server_and_requires_none_of_their_dependencies(client_wheel):
    names, meta = _metadata(client_wheel)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"lightpath", f"lightpath-{CLIENT['version']}.dist-info"}, tops
    assert "lightpath/v1/workload_scheduler_pb2.py" in names  # the stubs the SDK calls with
    assert "lightpath/data/philly_durations.csv" in names
    required = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist")}
    assert "grpcio" in required
    assert SERVER_ONLY >= {"starlette", "uvicorn", "ncclient", "matplotlib", "pydantic-settings"}
    assert not (required & SERVER_ONLY), sorted(required & SERVER_ONLY)
    with zipfile.ZipFile(client_wheel) as z:
        (points,) = [n for n in names if n.endswith("entry_points.txt")]
        scripts = z.read(points).decode()
    assert "lightpath = lightpath.cli:main" in scripts
    assert "lightpath_services" not in scripts


def test_the_services_wheel_holds_the_servers_and_requires_this_client(server_wheel):
    names, meta = _metadata(server_wheel)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"lightpath_services", f"lightpath_services-{SERVER['version']}.dist-info"}
    for service in ("cell_scheduler", "workload_scheduler", "ocs_manager", "console", "sim"):
        assert f"lightpath_services/{service}/__init__.py" in names
    assert "lightpath_services/common/txn.lua" in names  # package data travels too
    assert any(n.startswith("lightpath_services/console/static/") for n in names)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    (client,) = [r for r in requires if canonicalize_name(r.name) == "lightpath"]
    assert str(client.specifier) == f"=={CLIENT['version']}"


def test_the_client_imports_and_says_what_it_lacks_without_the_servers(client_wheel, tmp_path):
    """Every module of the client wheel imports with the servers and their dependencies
    hidden; `lightpath sim` and starting the stack say to install lightpath-services."""
    site = tmp_path / "site"
    with zipfile.ZipFile(client_wheel) as z:
        z.extractall(site)
        modules = sorted(
            n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            for n in z.namelist()
            if n.endswith(".py") and not n.endswith("__main__.py")  # those run the CLI
        )
    script = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys
        HIDDEN = {SERVER_MODULES!r}
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in HIDDEN:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Hide())
        sys.path.insert(0, {str(site)!r})
        for m in {modules!r}:
            importlib.import_module(m)
        import lightpath
        assert lightpath.__file__.startswith({str(site)!r}), lightpath.__file__
        from lightpath.cli import main
        code = main(["sim", "generate", "--jobs", "3", {str(tmp_path / "jobs.csv")!r}])
        assert code == 2, code
        from pathlib import Path
        from lightpath.stack import Stack, StackError
        try:
            Stack(Path({str(tmp_path / "state")!r})).start()
        except StackError as exc:
            print("stack:", exc)
        else:
            raise AssertionError("the stack started without the services")
        """
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    want = f"pip install lightpath-services=={CLIENT['version']}"
    assert (
        "lightpath sim: the simulator needs Lightpath's services" in done.stderr
        and want in done.stderr
    )
    assert "stack: starting the stack needs Lightpath's services" in done.stdout
    assert want in done.stdout
    assert not (tmp_path / "jobs.csv").exists() and not (tmp_path / "state").exists()
