"""Every read command scriptable (issue 33, item 3): `-o json|yaml|name|jsonpath=…` on
single objects (`job X -o yaml`, `pod pod-a -o json`), `-l` label selectors, `--sort-by`,
the AGE column and `jobs -w`; completion offers the cell's job and pod names. Against a
real cell over gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import yaml

from lightpath.cli import main

_SCRIPT = Path(sys.executable).parent / "lightpath"
LIGHTPATH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lightpath"]


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_every_read_command_takes_every_output_format(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    for job_id, prio, team in (("o-1", 30, "ml"), ("o-2", 90, "infra"), ("o-3", 60, "ml")):
        code, _, err = await run(
            capsys, "submit", job_id, "--shape", "1x1x1", "--blocks", "--priority", str(prio),
            "--label", f"team={team}",
        )  # fmt: skip
        assert code == 0, err

    code, out, err = await run(capsys, "job", "o-1", "-o", "yaml")
    assert code == 0, err
    assert "job_id: o-1\n" in out and "state: JOB_STATE_RUNNING" in out and '"job_id"' not in out
    assert 'created_at: "20' in out  # a string YAML would read as a time stays quoted
    as_yaml = out
    code, out, _ = await run(capsys, "-o", "json", "job", "o-1")
    assert json.loads(out)["spec"]["labels"] == {"team": "ml"}
    as_json = json.loads(out)
    for volatile in ("updated_at", "pod_job"):
        as_json.pop(volatile)
    read_back = yaml.safe_load(as_yaml)
    assert {k: v for k, v in read_back.items() if k not in ("updated_at", "pod_job")} == as_json
    code, out, _ = await run(capsys, "job", "o-1", "-o", "name")
    assert out == "o-1\n"
    code, out, _ = await run(capsys, "job", "o-1", "-o", "jsonpath={.priority} {.pod_id}")
    assert out == "30 pod-a\n"
    code, out, _ = await run(capsys, "pod", "pod-a", "-o", "json")
    assert code == 0 and json.loads(out)["view"]["pod_id"] == "pod-a"
    code, out, _ = await run(capsys, "pod", "pod-a", "-o", "jsonpath={.registration.pod_id}")
    assert out == "pod-a\n"
    code, out, _ = await run(capsys, "pods", "-o", "jsonpath={.pods[*].registration.pod_id}")
    assert out == "pod-a pod-b\n"
    template = '{range .jobs[*]}{.job_id}={.priority}{"\\n"}{end}'
    code, out, _ = await run(capsys, "jobs", "-o", f"jsonpath={template}", "--sort-by", "priority")
    assert out == "o-1=30\no-3=60\no-2=90\n\n"

    code, out, _ = await run(capsys, "jobs", "-l", "team=ml", "-o", "name")
    assert out.split() == ["o-3", "o-1"]
    code, out, _ = await run(capsys, "jobs", "-l", "team!=ml", "-o", "name")
    assert out.split() == ["o-2"]
    code, out, _ = await run(capsys, "jobs", "-l", "team", "-l", "!nothing", "-o", "name")
    assert sorted(out.split()) == ["o-1", "o-2", "o-3"]
    code, out, _ = await run(
        capsys, "jobs", "-l", "team=ml", "--sort-by", ".priority", "-o", "name"
    )
    assert out.split() == ["o-1", "o-3"]
    code, _, err = await run(capsys, "jobs", "-l", "team=ml=x")
    assert code != 0 and "-l 'team=ml=x': give key=value" in err

    code, out, _ = await run(capsys, "jobs")
    header, _, first = out.splitlines()[:3]
    assert header.split()[-1] == "age" and first.split()[-1].endswith("s")


async def test_jobs_watch_prints_each_change(cell2):
    proc = await asyncio.create_subprocess_exec(
        *LIGHTPATH,
        "jobs",
        "-w",
        "--no-headers",
        env={**os.environ, "LIGHTPATH_CELL_ADDR": cell2.cell_addresses[0]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        await asyncio.sleep(1.0)
        await cell2.submit("w-1", (4, 4, 4))
        lines: list[str] = []
        while not any(line.startswith("w-1 ") for line in lines):
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "jobs -w ended"
            lines.append(line.decode())
        assert "RUNNING" in lines[-1] or "PENDING" in lines[-1] or "WIRING" in lines[-1]
    finally:
        proc.terminate()
        await proc.wait()


async def test_completion_offers_job_and_pod_names(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    await cell2.submit("c-job", (4, 4, 4))

    def complete(*words: str) -> list[str]:
        assert main(["__complete", *words]) == 0
        return capsys.readouterr().out.splitlines()

    assert "c-job" in await asyncio.to_thread(complete, "job")
    assert "c-job" in await asyncio.to_thread(complete, "cancel")
    assert "c-job" not in await asyncio.to_thread(complete, "job", "c-job")
    assert {"pod-a", "pod-b"} <= set(await asyncio.to_thread(complete, "pod"))
    assert {"pod-a", "pod-b"} <= set(await asyncio.to_thread(complete, "jobs", "--pod"))
    assert {"pod-a", "pod-b"} <= set(await asyncio.to_thread(complete, "block"))
    assert "pod-a" not in await asyncio.to_thread(complete, "block", "pod-a")
