#!/usr/bin/env python3
"""Build the image deploy/docker-compose.yml runs, with no container registry and no
network inside the build:

    python scripts/compose_image.py            # base image, wheelhouse, lightpath:dev

1. the base image `lightpath-base:bookworm`, once: Debian 12 (python3, python3-venv,
   redis-server) made with `debootstrap` and `docker import` (it stays in the engine's
   image store, so later runs skip this);
2. deploy/wheelhouse: the host's pip downloads every locked wheel (exact versions,
   for the base's Python and glibc), setuptools to build Lightpath with, and writes
   interpreter.lock: what the base's own Python needs beyond the lock, read from the
   locked wheels' metadata with markers evaluated on that interpreter;
3. `docker build` of deploy/Dockerfile (the engine's layer cache makes a rebuild of
   unchanged files a no-op).

Needs a running engine (tests/test_compose_stack.py starts one when it can) and, for
step 1, root with `debootstrap` (python3 dev.py test installs it with apt-get).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEBIAN_SUITE = "bookworm"
DEBIAN_PYTHON = "3.11"  # its python3 (3.11.2): deploy/requirements.lock is made for 3.11
BASE_IMAGE = f"lightpath-base:{DEBIAN_SUITE}"
IMAGE = "lightpath:dev"
WHEELHOUSE = ROOT / "deploy" / "wheelhouse"
LOCK = ROOT / "deploy" / "requirements.lock"
# Wheels downloaded once per machine (CI's fresh clones reuse them).
WHEEL_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightpath" / "wheels"
)
BASE_PACKAGES = ("python3", "python3-venv", "redis-server")
DEBIAN_MIRROR = os.environ.get("LIGHTPATH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the base's glibc (2.36) and CPython (3.11) accept, newest first.
PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64")
BUILD_BACKEND = "setuptools>=77"  # pyproject.toml's [build-system] requires

# The marker environment of the base's python3, as packaging evaluates markers.
_MARKER_ENV = """import json, os, platform, sys
print(json.dumps({
    "implementation_name": sys.implementation.name,
    "implementation_version": platform.python_version(),
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": "", "platform_system": platform.system(), "platform_version": "",
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform, "extra": ""}))"""


class EngineUnavailable(RuntimeError):
    """No container engine can be had here (the reason is the message)."""


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=True, text=True, capture_output=True, **kw)


def engine_running() -> bool:
    if not shutil.which("docker"):
        return False
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    return done.returncode == 0


@contextlib.contextmanager
def engine(log: Path, timeout_s: float = 60) -> Iterator[None]:
    """A container engine for the block: the one running, or Debian's dockerd started
    here (overlay2) and stopped after; EngineUnavailable says why there can be none."""
    if engine_running():
        yield
        return
    dockerd = shutil.which("dockerd")
    if os.name != "posix" or os.geteuid() != 0:
        raise EngineUnavailable("no container engine is running and dockerd needs root")
    if not dockerd or not shutil.which("docker"):
        raise EngineUnavailable(
            "no container engine: `apt-get install docker.io` (python3 dev.py test does it as root)"
        )
    with log.open("ab") as out:
        proc = subprocess.Popen(
            # The host's firewall, forwarding and bridges stay as they were: no iptables
            # rules (published ports go through the engine's userland proxy, which is
            # all loopback publishing needs), no docker0 (compose makes its own network).
            [
                dockerd,
                "--storage-driver",
                "overlay2",
                "--iptables=false",
                "--ip-forward=false",
                "--bridge=none",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not engine_running():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise EngineUnavailable(f"dockerd did not start: {' | '.join(tail)}")
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def ensure_base_image() -> str:
    """lightpath-base:bookworm, made with debootstrap + docker import when the engine
    lacks it (a minute or two, once per engine)."""
    if image_exists(BASE_IMAGE):
        return "cached"
    if not shutil.which("debootstrap"):
        raise EngineUnavailable("no base image and no debootstrap: `apt-get install debootstrap`")
    with tempfile.TemporaryDirectory(prefix="lightpath-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            check=True,
            capture_output=True,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True)
        if tar.wait() != 0:
            raise RuntimeError("tar of the debootstrap root file system failed")
    return "made"


def base_marker_env() -> dict[str, str]:
    out = docker("run", "--rm", "--network", "none", BASE_IMAGE, "python3", "-c", _MARKER_ENV)
    return json.loads(out.stdout)


def _pip_download(requirements: list[str], dest: Path, python_version: str = "") -> None:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    args.append("--only-binary=:all:")
    if python_version:  # for the base's interpreter, not this one
        args += ["--implementation", "cp", "--python-version", python_version]
        for platform in PLATFORMS:
            args += ["--platform", platform]
    subprocess.run([*args, *requirements], check=True)


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    prefix = "Requires-Dist:"
    return [line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)]


def _newest(cache: Path, requirement: str) -> Path | None:
    """The newest wheel in `cache` that satisfies `requirement` (`name==1.0`, `name>=2`)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    req = Requirement(requirement)
    found = []
    for wheel in cache.glob("*.whl"):
        name, version = parse_wheel_filename(wheel.name)[:2]
        if name == canonicalize_name(req.name) and req.specifier.contains(
            version, prereleases=True
        ):
            found.append((version, wheel))
    return max(found)[1] if found else None


def fill_wheelhouse(env: dict[str, str]) -> list[str]:
    """deploy/wheelhouse for the base's interpreter `env`: the locked wheels, the build
    backend (build/), and interpreter.lock (returned) pinning what that interpreter needs
    beyond the lock. Wheels are downloaded once into WHEEL_CACHE and linked from there,
    so a fresh clone on the same machine downloads nothing."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    cache = WHEEL_CACHE / f"cp{env['python_version'].replace('.', '')}"
    (cache / "build").mkdir(parents=True, exist_ok=True)

    def fetch(requirements: list[str], into: Path, python_version: str = "") -> list[Path]:
        missing = [r for r in requirements if _newest(into, r) is None]
        if missing:
            _pip_download(missing, into, python_version)
        wheels = [_newest(into, r) for r in requirements]
        assert all(wheels), f"pip downloaded no wheel for one of {requirements}"
        return [w for w in wheels if w]

    locked = [line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")]
    wheels = fetch(locked, cache, env["python_version"])
    have = {canonicalize_name(line.split("==")[0]) for line in locked}
    extra: list[Path] = []
    todo = list(wheels)
    while todo:  # what the locked wheels require on this interpreter, beyond the lock
        for raw in _requires(todo.pop()):
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            if canonicalize_name(req.name) in have:
                continue
            have.add(canonicalize_name(req.name))
            (wheel,) = fetch([f"{req.name}{req.specifier}"], cache, env["python_version"])
            extra.append(wheel)
            todo.append(wheel)
    backend = fetch([BUILD_BACKEND], cache / "build")

    if WHEELHOUSE.exists():
        shutil.rmtree(WHEELHOUSE)
    (WHEELHOUSE / "build").mkdir(parents=True)
    for wheel in [*wheels, *extra, *backend]:
        target = WHEELHOUSE / wheel.relative_to(cache)
        try:
            os.link(wheel, target)
        except OSError:  # another file system
            shutil.copy2(wheel, target)
    pins = sorted("{}=={}".format(*parse_wheel_filename(w.name)[:2]) for w in extra)
    (WHEELHOUSE / "interpreter.lock").write_text(
        f"# What Python {env['python_full_version']} (the base image's) needs beyond\n"
        "# deploy/requirements.lock; written by scripts/compose_image.py.\n"
        + "".join(f"{pin}\n" for pin in pins)
    )
    return pins


def build_image() -> None:
    """lightpath:dev from deploy/Dockerfile with the engine's own builder (no buildx);
    the image it replaces is removed (its layers shared with the new one stay)."""
    before = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True
    ).stdout.strip()
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    done = subprocess.run(
        ["docker", "build", "-q", "--force-rm", "-f", "deploy/Dockerfile", "-t", IMAGE, "."],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"docker build failed:\n{(done.stdout + done.stderr)[-4000:]}")
    after = docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    if before and before != after:
        subprocess.run(["docker", "image", "rm", before], capture_output=True)


def ensure_image() -> dict[str, object]:
    """Base image, wheelhouse and lightpath:dev; what each step took (seconds)."""
    took: dict[str, object] = {}
    t = time.monotonic()
    took["base"] = ensure_base_image()
    took["base_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    env = base_marker_env()
    if env["python_version"] != DEBIAN_PYTHON:
        raise RuntimeError(
            f"{BASE_IMAGE} has Python {env['python_full_version']}; deploy/requirements.lock "
            f"is made for {DEBIAN_PYTHON}"
        )
    took["interpreter_lock"] = fill_wheelhouse(env)
    took["wheelhouse_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    build_image()
    took["build_s"] = round(time.monotonic() - t, 1)
    return took


def main(argv: list[str]) -> int:
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(json.dumps(ensure_image()))
    except EngineUnavailable as e:
        print(f"compose_image: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
