"""Contexts (issue 19): a config file names remote stacks' addresses and credentials;
the CLI and the SDK reach a cell through one without any address or TLS setting."""

from __future__ import annotations

import asyncio
import json

from lightpath.cli import main
from lightpath.embedded_redis import free_port
from lightpath.sdk import Cell
from tests.helpers import identity


def write_config(path, cell_address: str, *, current: str = "") -> None:
    files = identity("operator:operator")
    path.write_text(
        (f'current_context = "{current}"\n' if current else "")
        + f"""
[contexts.remote]
tls_ca = "{files.ca}"
tls_cert = "{files.cert}"
tls_key = "{files.key}"

[contexts.remote.addresses]
cell-scheduler = "{cell_address}"

[contexts.other]
[contexts.other.addresses]
cell-scheduler = "127.0.0.1:1"
"""
    )


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_a_context_gives_the_address_and_the_credentials(
    cell2, capsys, monkeypatch, tmp_path
):
    config = tmp_path / "config.toml"
    write_config(config, cell2.cell_addresses[0])
    monkeypatch.setenv("LIGHTPATH_CONFIG", str(config))
    for name in ("LIGHTPATH_TLS_CA", "LIGHTPATH_TLS_CERT", "LIGHTPATH_TLS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.delenv("LIGHTPATH_CELL_ADDR", raising=False)
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(tmp_path / "no-stack"))

    code, out, err = await run(capsys, "--context", "remote", "submit", "ctx-1", "--shape", "4x4x4")
    assert code == 0, err
    code, out, _ = await run(capsys, "--context", "remote", "jobs", "-o", "name")
    assert code == 0 and out.split() == ["ctx-1"]

    code, out, _ = await run(capsys, "--context", "remote", "contexts")
    marked = [line.split()[:2] for line in out.splitlines() if line.startswith("*")]
    assert code == 0 and marked == [["*", "remote"]]

    code, _, err = await run(capsys, "--context", "nope", "jobs")
    assert code == 2 and "no context 'nope' in " in err and "(it has: other, remote)" in err

    # the file's current_context, and LIGHTPATH_CONTEXT, choose one as --context does
    write_config(config, cell2.cell_addresses[0], current="remote")
    code, out, _ = await run(capsys, "jobs", "-o", "name")
    assert code == 0 and out.split() == ["ctx-1"]

    def from_the_sdk() -> tuple[str, str]:
        with Cell() as cell:
            return cell.get("ctx-1").job_id, cell.aio.address_source

    job_id, source = await asyncio.to_thread(from_the_sdk)
    assert job_id == "ctx-1" and source == f"context remote in {config}"

    # an address setting still wins over the context's address
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", f"127.0.0.1:{free_port()}")
    code, _, err = await run(capsys, "jobs")
    assert code == 1 and "taken from LIGHTPATH_CELL_ADDR" in err
    monkeypatch.delenv("LIGHTPATH_CELL_ADDR")
    monkeypatch.setenv("LIGHTPATH_CONTEXT", "other")
    code, out, _ = await run(capsys, "contexts", "--json")
    assert json.loads(out)["current_context"] == "other"
