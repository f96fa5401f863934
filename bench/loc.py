"""Benchmark: lines of hand-written code in a commit, side by side with baselines (issue 31).

    python3 dev.py bench loc [REV] [--baseline REV ...]

Counts the lines of Python, Lua and the web console's JavaScript, HTML and
CSS in the committed tree of REV (default HEAD), read from git so any commit can be
counted without checking it out. Left out: the generated gRPC stubs (lightpath/v1),
the tests (tests/), the documentation (docs/). Everything else counts: the client, the
services, bench/, scripts/, deploy/ and examples/. Python's docstrings and comments
count (they are written and read by hand too); Lua inside Python strings counts as
Python.

Prints one JSON line: `lines` (the total, the measure of the issue's "62k hand-written
lines"), `non_blank_lines`, `by_language`, `by_area` (the first path
component), `commit`; for each `--baseline` the same under `baselines` with `delta`
(REV's lines minus the baseline's) and `delta_fraction`. YAML (deployment manifests,
not code) is given apart as `yaml_lines`, in no total.
"""

from __future__ import annotations

import argparse
import subprocess
from collections import Counter
from pathlib import Path

from _common import emit

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {".py": "python", ".lua": "lua", ".js": "javascript", ".html": "html", ".css": "css"}
LEFT_OUT = ("lightpath/v1/", "tests/", "docs/")


def _git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], input=stdin, capture_output=True, check=True
    ).stdout


def _blobs(commit: str) -> list[tuple[str, str]]:
    """(path, blob id) of every file in the commit's tree."""
    out = []
    for entry in _git("ls-tree", "-r", "-z", commit).split(b"\0"):
        if not entry:
            continue
        meta, path = entry.decode().split("\t", 1)
        _mode, kind, blob = meta.split()
        if kind == "blob":
            out.append((path, blob))
    return out


def _contents(blobs: list[str]) -> list[bytes]:
    """The blobs' contents, read through one `git cat-file --batch`."""
    raw = _git("cat-file", "--batch", stdin="".join(f"{b}\n" for b in blobs).encode())
    out, pos = [], 0
    for _ in blobs:
        header_end = raw.index(b"\n", pos)
        size = int(raw[pos:header_end].split()[2])
        out.append(raw[header_end + 1 : header_end + 1 + size])
        pos = header_end + 1 + size + 1  # the content, then a newline
    return out


def _lines(text: bytes) -> int:
    return len(text.splitlines())


def _non_blank(text: bytes) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def count(rev: str) -> dict:
    commit = _git("rev-parse", "--short", f"{rev}^{{commit}}").decode().strip()
    files = _blobs(commit)
    counted = [
        (path, blob)
        for path, blob in files
        if Path(path).suffix in LANGUAGES and not path.startswith(LEFT_OUT)
    ]
    yaml = [(p, b) for p, b in files if p.endswith((".yaml", ".yml"))]
    by_language: Counter[str] = Counter()
    by_area: Counter[str] = Counter()
    non_blank = 0
    for (path, _), text in zip(counted, _contents([b for _, b in counted]), strict=True):
        n = _lines(text)
        non_blank += _non_blank(text)
        by_language[LANGUAGES[Path(path).suffix]] += n
        by_area[path.split("/", 1)[0] if "/" in path else "."] += n
    return {
        "rev": rev,
        "commit": commit,
        "lines": sum(by_language.values()),
        "non_blank_lines": non_blank,
        "files": len(counted),
        "by_language": dict(sorted(by_language.items())),
        "by_area": dict(sorted(by_area.items())),
        "yaml_lines": sum(_lines(t) for t in _contents([b for _, b in yaml])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", default="HEAD", help="the commit to count (HEAD)")
    parser.add_argument(
        "--baseline", action="append", default=[], help="a commit to compare with (repeatable)"
    )
    args = parser.parse_args()
    result = count(args.rev)
    baselines = []
    for rev in args.baseline:
        base = count(rev)
        base["delta"] = result["lines"] - base["lines"]
        base["delta_fraction"] = base["delta"] / base["lines"]
        baselines.append(base)
    if baselines:
        result["baselines"] = baselines
    emit(result)


if __name__ == "__main__":
    main()
