"""The day-one paths of the docs run as written (issue 33): every ```sh day-one block of
docs/usage.md, docs/agg_switch.md and docs/graphs.md, in the order the page gives them,
on one fresh local stack — as a newcomer would paste them, from the directory whose
`.lightpath` is the stack (what `lightpath up` there makes), through the CLI of this
checkout. `.venv/bin/lightpath` and `python examples/...` are this checkout's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightpath.stack import Stack, default_topology, with_ephemeral_ports

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("day-one-docs")]

ROOT = Path(__file__).resolve().parents[1]
DOCS = {
    "usage": ROOT / "docs" / "usage.md",
    "agg_switch": ROOT / "docs" / "agg_switch.md",
    "graphs": ROOT / "docs" / "graphs.md",
}
# What each page's commands must have printed: the step that shows each worked.
SAID = {
    "usage": ["RUNNING on pod-", "labels: team=ml", "\ntrain-1\n", "COMPLETED"],
    "agg_switch": [
        "sub-1  SWITCH   root",  # the tree lightpath up defined
        "command c1: COMPLETED",
        "timed out: n3",
        "failed (aborted)",
        "every node got the sum",
    ],
    "graphs": ["every process holds its cores", "run run-3 of graph fig-3a", "succeeded"],
}


def day_one_blocks(doc: Path) -> list[str]:
    return re.findall(r"^```sh day-one\n(.*?)^```", doc.read_text(), re.S | re.M)


def script(doc: Path) -> str:
    """The page's day-one blocks as one bash script, this checkout's CLI and examples."""
    lightpath = str(Path(sys.executable).with_name("lightpath"))
    body = "\n".join(day_one_blocks(doc))
    body = body.replace(".venv/bin/lightpath", lightpath)
    body = re.sub(r"^python examples/", f"{sys.executable} {ROOT}/examples/", body, flags=re.M)
    return "set -euo pipefail\nset -x\n" + body


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh stack in <dir>/.lightpath, and the environment of a shell in <dir> with no
    Lightpath settings and a config file of its own (no context: the directory's stack)."""
    here = tmp_path_factory.mktemp("day-one")
    stack = Stack(
        here / ".lightpath",
        specs=with_ephemeral_ports(default_topology()),
        redis_port=0,
        log=lambda *_: None,
    )
    stack.start(timeout=180)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_")}
    env["LIGHTPATH_CONFIG"] = str(here / "config.toml")
    try:
        yield here, env
    finally:
        stack.stop()


def test_each_page_has_a_day_one_path():
    for name, doc in DOCS.items():
        blocks = day_one_blocks(doc)
        assert blocks, f"{doc} has no ```sh day-one block"
        assert all(".venv/bin/lightpath" in b for b in blocks), name
        assert not re.search(r"lightpath up\b", "".join(blocks))  # the stack is there already


@pytest.mark.parametrize("name", list(DOCS))  # in this order: usage, agg_switch, graphs
def test_the_pages_day_one_commands_run_in_order_on_a_fresh_stack(fresh, name):
    here, env = fresh
    assert shutil.which("bash")
    done = subprocess.run(
        ["bash", "-c", script(DOCS[name])],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    shown = done.stdout + "\n--- stderr ---\n" + done.stderr
    assert done.returncode == 0, shown[-6000:]
    for said in SAID[name]:
        assert said in done.stdout, f"{said!r} not in the output:\n{shown[-6000:]}"
