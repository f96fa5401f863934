"""`-o jsonpath=TEMPLATE`: kubectl's JSONPath templates over a command's JSON answer.

    {.state}                                    one field
    {.pod_job.blocks[0].block_id}               into lists by index
    {.jobs[*].job_id}                           every item (printed space-separated)
    {range .jobs[*]}{.job_id}{"\\t"}{.state}{"\\n"}{end}
    .spec.priority                              a template without braces is one path

Paths: `.name` or `['name']` a field, `[N]` an item (negative from the end), `[*]` or
`.*` every item or value; `$` or `@` the current object. Text outside braces is printed
as it is; `{"..."}` prints a string with \\n and \\t escapes. A field that is absent
prints nothing (an error names the template only when it does not parse).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


class JsonPathError(ValueError):
    """A template that does not parse, said in the user's terms."""


@dataclass
class _Node:
    kind: str  # text | path | range
    value: Any = None  # the text, or the path's steps
    children: list[_Node] = field(default_factory=list)


_STEP = re.compile(r"\.\*|\.([A-Za-z_][\w-]*)|\[\*\]|\[(-?\d+)\]|\[['\"]([^'\"]+)['\"]\]|\.\.")


def _steps(path: str) -> list[tuple[str, Any]]:
    path = path.strip()
    if path.startswith(("$", "@")):
        path = path[1:]
    steps: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if not m or m.group(0) == "..":
            raise JsonPathError(
                f"cannot read {path[pos:]!r} of the path {path!r}: use .field, [N], [*] or "
                "['field']"
            )
        if m.group(0) in (".*", "[*]"):
            steps.append(("all", None))
        elif m.group(2) is not None:
            steps.append(("index", int(m.group(2))))
        else:
            steps.append(("key", m.group(1) or m.group(3)))
        pos = m.end()
    return steps


def parse(template: str) -> list[_Node]:
    """The template's nodes; JsonPathError when it does not parse."""
    if "{" not in template:
        template = "{" + template + "}"
    root: list[_Node] = []
    stack = [root]
    pos = 0
    for m in re.finditer(r"\{([^{}]*)\}", template):
        if m.start() > pos:
            stack[-1].append(_Node("text", template[pos : m.start()]))
        pos = m.end()
        body = m.group(1).strip()
        if body.startswith("range "):
            node = _Node("range", _steps(body[6:]))
            stack[-1].append(node)
            stack.append(node.children)
        elif body == "end":
            if len(stack) == 1:
                raise JsonPathError("{end} without a {range ...} before it")
            stack.pop()
        elif body[:1] in "\"'" and body[-1:] == body[:1] and len(body) >= 2:
            text = body[1:-1].replace("\\n", "\n").replace("\\t", "\t")
            stack[-1].append(_Node("text", text))
        elif not body:
            raise JsonPathError("an empty {} in the template")
        else:
            stack[-1].append(_Node("path", _steps(body)))
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise JsonPathError(f"unbalanced braces in {template!r}")
    if rest:
        stack[-1].append(_Node("text", rest))
    if len(stack) != 1:
        raise JsonPathError("a {range ...} without its {end}")
    return root


def _walk(steps: list[tuple[str, Any]], data: Any) -> list[Any]:
    current = [data]
    for kind, arg in steps:
        out: list[Any] = []
        for value in current:
            if kind == "key" and isinstance(value, dict) and arg in value:
                out.append(value[arg])
            elif kind == "index" and isinstance(value, list) and -len(value) <= arg < len(value):
                out.append(value[arg])
            elif kind == "all" and isinstance(value, list):
                out.extend(value)
            elif kind == "all" and isinstance(value, dict):
                out.extend(value[k] for k in sorted(value))
        current = out
    return current


def values(path: str, data: Any) -> list[Any]:
    """What the path (`.a.b[0]`) finds in `data`."""
    return _walk(_steps(path.strip().removeprefix("{").removesuffix("}")), data)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _render(nodes: list[_Node], data: Any) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.value)
        elif node.kind == "path":
            out.append(" ".join(_show(v) for v in _walk(node.value, data)))
        else:
            out.extend(_render(node.children, item) for item in _walk(node.value, data))
    return "".join(out)


def evaluate(template: str, data: Any) -> str:
    """The template filled in from `data` (JSON data)."""
    return _render(parse(template), data)
