"""Helpers shared by the CLI topics: --json output, tables, gRPC errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from lightpath.client import error_report


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def to_jsonable(value: Any) -> Any:
    if isinstance(value, Message):
        return json_format.MessageToDict(value, preserving_proto_field_name=True)
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, sort_keys=True))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers)), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_rpc(fn: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run an async CLI action; a gRPC error becomes one readable line on stderr and exit code 1."""
    try:
        return int(asyncio.run(fn()) or 0)
    except grpc.aio.AioRpcError as err:
        report = error_report(err)
        print(f"error: {report}", file=sys.stderr)
        for field, rule in report.field_violations:
            print(f"  {field}: {rule}", file=sys.stderr)
        return 1
