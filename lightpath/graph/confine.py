"""Files of a graph run kept inside one directory, checked when each is opened (issue 30).

A graph run on the core broker reads and writes only inside the broker's graph
data directory. The broker checks the paths a request names (with every
substitution, such as `{part}`, filled in) before the run starts; this module is
the check at open time, in the worker itself, on the path as the operating system
resolves it then: a symbolic link that leads outside the directory, placed there
before or during the run, is refused.

The directory is the workers' environment variable LIGHTPATH_GRAPH_DATA_ROOT;
without it (a graph run by the SDK on a user's own machine) paths are used as given.
Errors name paths relative to the directory, never the directory itself.
"""

from __future__ import annotations

import os

ROOT_ENV = "LIGHTPATH_GRAPH_DATA_ROOT"


class PathOutside(ValueError):
    """A path that leads outside the graph data directory."""


def data_root() -> str | None:
    root = os.environ.get(ROOT_ENV, "")
    return os.path.realpath(root) if root else None


def shown(path: str, root: str | None) -> str:
    """`path` as a caller may see it: relative to `root` when inside it."""
    if root is None:
        return path
    absolute = os.path.abspath(path)
    if absolute == root or absolute.startswith(root + os.sep):
        return os.path.relpath(absolute, root)
    return os.path.basename(path) or path


def inside(resolved: str, root: str) -> bool:
    return resolved == root or resolved.startswith(root + os.sep)


def resolve(path: str, root: str | None = None) -> str:
    """`path` with every symbolic link resolved, refused (PathOutside) when that leaves
    `root` (default: the run's data directory, when there is one)."""
    root = data_root() if root is None else os.path.realpath(root)
    if root is None:
        return path
    resolved = os.path.realpath(path)
    if not inside(resolved, root):
        raise PathOutside(
            f"{shown(path, root)!r} leads outside the graph data directory "
            "(a symbolic link, or `..`); use a path inside it"
        )
    return resolved
