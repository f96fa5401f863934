"""The CLI for scripts (issue 19): complete --json, errors as JSON, line-delimited
streams, pipe-safe output, -o formats, --no-headers, --all / --page-token."""

from __future__ import annotations

import asyncio
import io
import json

import yaml

from lightpath.cli import main


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_json_has_every_field_and_errors_are_json(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    code, out, _ = await run(capsys, "submit", "j-1", "--shape", "4x4x4", "--json")
    assert code == 0
    job = json.loads(out)["job"]
    # zeros and empty values are there: a job on a pod is at queue position 0
    assert job["cell_queue_position"] == 0 and job["shape_derived"] is False
    assert job["spec"]["priority"] == 0 and job["spec"]["wrap"] == []
    assert job["last_known_state"] == "JOB_STATE_UNSPECIFIED"
    assert job["pod_job"]["blocks"][0]["position"]["coords"] == [0, 0, 0]

    code, out, err = await run(capsys, "job", "nope", "--json")
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "NOT_FOUND" and "nope" in error["message"]
    assert error["trace_id"] and error["address"] == cell2.cell_addresses[0]

    code, _, err = await run(capsys, "submit", "bad", "--shape", "6x4x4", "--json")
    error = json.loads(err)["error"]
    assert code == 1 and error["code"] == "INVALID_ARGUMENT"
    assert any(v["field"] == "spec.shape.dims[0]" for v in error["field_violations"])

    code, _, err = await run(capsys, "submit", "bad", "--shape", "6x4x4")
    assert code == 1 and err.count("spec.shape.dims[0]") == 1  # said once, not again below

    code, _, err = await run(capsys, "jobs", "--state", "runing", "--json")
    error = json.loads(err)["error"]
    assert code == 1 and "pending, wiring, running" in error["message"]
    code, _, err = await run(capsys, "jobs", "--state", "runing")
    assert code == 1 and "unknown job state 'runing': one of pending" in err


async def test_watch_json_is_one_object_a_line(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    await run(capsys, "submit", "w-1", "--shape", "4x4x4")
    await run(capsys, "complete", "w-1")
    code, out, _ = await run(capsys, "watch", "w-1", "--json")
    lines = out.strip().splitlines()
    events = [json.loads(line) for line in lines]
    assert code == 0 and len(events) >= 3
    assert events[0]["from_state"] == "JOB_STATE_UNSPECIFIED"  # zero enums are printed too
    assert events[-1]["to_state"] == "JOB_STATE_COMPLETED"


async def test_list_formats_headers_and_pages(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    for i in range(5):
        await run(capsys, "submit", f"l-{i}", "--shape", "1x1x1", "--blocks", "--tenant", "t")
    long_reason = "r" * 80
    await run(capsys, "cancel", "l-0", "--reason", long_reason)

    code, out, err = await run(capsys, "jobs", "--tenant", "t", "--limit", "2")
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split()[:3] == ["job", "tenant", "state"]
    assert [line.split()[0] for line in lines[2:]] == ["l-4", "l-3"]
    assert "more jobs: --all lists every one, --page-token " in err
    token = err.split("--page-token ")[1].split()[0]
    code, out, _ = await run(capsys, "jobs", "--tenant", "t", "--limit", "2", "--page-token", token)
    assert [line.split()[0] for line in out.strip().splitlines()[2:]] == ["l-2", "l-1"]

    code, out, err = await run(capsys, "jobs", "--tenant", "t", "--all", "-o", "name")
    assert out.split() == ["l-4", "l-3", "l-2", "l-1", "l-0"] and "more jobs" not in err
    code, out, _ = await run(capsys, "jobs", "--tenant", "t", "--all", "--no-headers")
    assert [line.split()[0] for line in out.strip().splitlines()] == [
        "l-4",
        "l-3",
        "l-2",
        "l-1",
        "l-0",
    ]
    cancelled = next(line for line in out.splitlines() if line.startswith("l-0"))
    assert cancelled.rstrip().endswith("…") and long_reason not in cancelled
    code, out, _ = await run(capsys, "jobs", "--tenant", "t", "-o", "wide")
    assert long_reason in out and "blocks" in out.splitlines()[0]

    code, out, _ = await run(capsys, "jobs", "--tenant", "t", "--limit", "2", "-o", "json")
    page = json.loads(out)
    assert [j["job_id"] for j in page["jobs"]] == ["l-4", "l-3"] and page["next_page_token"]
    code, out, _ = await run(capsys, "jobs", "--tenant", "t", "--all", "-o", "yaml")
    data = yaml.safe_load(out)
    assert [j["job_id"] for j in data["jobs"]] == ["l-4", "l-3", "l-2", "l-1", "l-0"]
    assert data["jobs"][0]["cell_queue_position"] == 0

    code, out, _ = await run(capsys, "pods", "-o", "name")
    assert sorted(out.split()) == ["pod-a", "pod-b"]
    code, out, _ = await run(capsys, "pods", "--no-headers")
    assert out.splitlines()[0].startswith("pod-")


async def test_submit_with_parallelism_and_validate_only(cell2, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    code, out, _ = await run(capsys, "submit", "v-1", "--shape", "4x4x4", "--validate-only")
    assert code == 0 and out.startswith("nothing submitted (--validate-only): ")
    code, out, err = await run(
        capsys,
        "submit",
        "par-1",
        "--shape",
        "4x4x4",
        "--data",
        "4",
        "--pipeline",
        "4",
        "--layer",
        "4",
        "--json",
    )
    assert code == 0, err
    spec = json.loads(out)["job"]["spec"]
    assert spec["parallelism"] == {"data": 4, "pipeline": 4, "layer": 4}


async def test_a_closed_pipe_ends_the_command_quietly(cell2, capsys, monkeypatch):
    """`lightpath jobs --json | head`: the reader goes away; no BrokenPipeError escapes."""
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", cell2.cell_addresses[0])
    await run(capsys, "submit", "pipe-1", "--shape", "4x4x4")
    writes: list[str] = []

    class ClosedPipe(io.StringIO):
        def write(self, s: str) -> int:
            writes.append(s)
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    for argv in (["jobs", "--json"], ["watch", "pipe-1", "--json"], ["jobs"]):
        writes.clear()
        assert await asyncio.to_thread(main, argv) == 0
        assert writes  # it did write, and the closed pipe did not crash it
