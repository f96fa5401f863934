"""Issue 30: a graph run on the broker stays inside its data directory, whatever the
path templates and symbolic links: checked with every `{part}` filled in before the
run, and again on the resolved path as each file is opened."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.errors import InvalidArgument
from lightpath.graph import confine as graph_confine
from lightpath.graph.components.base import ComponentError
from lightpath.graph.components.files import FileReader, FileWriter
from lightpath.graph.examples import fig3a, write_records
from lightpath.graph.spec import to_proto
from lightpath.v1 import core_broker_pb2 as pb
from lightpath_services.core_broker.graph_runs import confine, worker_env
from tests.core_broker.conftest import fails
from tests.graph.test_broker_runs import DEGREE, _ended, _reserve, broker  # noqa: F401

C = grpc.StatusCode

# What the data directory holds: links that stay inside, links that leave it.
LINKS = {
    "in-ok": "real",  # a directory inside
    "in-file": "real/f",  # a file inside
    "out-dir": "{outside}",  # a directory outside
    "out-file": "{outside}/secret",  # a file outside
    "lnk-T0": "{outside}/t0",
    "lnk-T1": "real/t1",  # only part 0 leaves
    "loop": "loop",  # a link to itself
}
SEGMENTS = st.sampled_from(
    ["real", "x", "..", ".", "{part}", "lnk-T{part}", *LINKS, "a{part}b", "real/{part}"]
)


def _reader(path: Path) -> FileReader:
    return FileReader(str(path), lambda batch: None, owner="c", feeds=frozenset({"c"}))


def _tree(base: Path) -> tuple[Path, Path]:
    data, outside = base / "data", base / "outside"
    (data / "real").mkdir(parents=True)
    (data / "real" / "f").write_text("h\n")
    outside.mkdir()
    (outside / "secret").write_text("s\n")
    for name, target in LINKS.items():
        (data / name).symlink_to(target.replace("{outside}", str(outside)))
    return data, outside


def _leaves(template: str, data: Path, parts: int) -> bool:
    root = os.path.realpath(data)
    filled = (
        [template.replace("{part}", str(i)) for i in range(parts)]
        if "{part}" in template
        else [template]
    )
    for path in filled:
        try:
            resolved = os.path.realpath(data / path)
        except (OSError, ValueError, RuntimeError):
            return True
        if not graph_confine.inside(resolved, root):
            return True
    return False


@settings(max_examples=150)
@given(segments=st.lists(SEGMENTS, min_size=1, max_size=4), parts=st.integers(1, 3))
def test_confine_refuses_exactly_the_templates_that_leave_the_data_directory(segments, parts):
    template = "/".join(segments)
    with tempfile.TemporaryDirectory() as base:
        data, outside = _tree(Path(base))
        spec = to_proto(fig3a(template, "out.{part}", 2))
        leaves = _leaves(template, data, max(parts, 2))
        try:
            out = confine(spec, data, parts=parts)
        except InvalidArgument as exc:
            assert leaves, f"{template!r} stays inside, but: {exc}"
            (v,) = exc.violations
            assert v.field == "graph.datasets[0].path"
            # Paths relative to the data directory: never the broker's own directories.
            assert str(data) not in exc.message and base not in exc.message
            assert str(outside) not in exc.message
        else:
            assert not leaves, f"{template!r} leaves the data directory but was taken"
            assert out.datasets[0].path.startswith(str(data.resolve()))


def test_a_template_is_kept_as_it_was_checked_through_its_links(tmp_path):
    # Found by the property test above: `..` after a link is taken where the link leads
    # (in-file is real/f), not textually, both in the check and in the path kept.
    data, _ = _tree(tmp_path)
    for template, where in (
        ("in-file/../x{part}", "real/x{part}"),
        ("in-file/../../{part}", "{part}"),
    ):
        out = confine(to_proto(fig3a(template, "out.{part}", 2)), data, parts=2)
        assert out.datasets[0].path == f"{data.resolve()}/{where}"


def test_a_link_made_after_the_check_is_refused_when_the_file_is_opened(tmp_path, monkeypatch):
    data, outside = _tree(tmp_path)
    monkeypatch.setenv(graph_confine.ROOT_ENV, str(data))
    # Reading through a link that leaves: refused, naming the path as given, relatively.
    reader = _reader(data / "out-file")
    with pytest.raises(ComponentError) as caught:
        reader._open()
    assert "'out-file' leads outside" in str(caught.value)
    assert str(tmp_path) not in str(caught.value)
    # Writing through a directory link that leaves: refused, nothing written outside.
    writer = FileWriter(str(data / "out-dir" / "new"))
    with pytest.raises(ComponentError, match="leads outside"):
        writer._open()
    assert not (outside / "new").exists()
    # A link to the final name, swapped in after the path was resolved: not followed.
    (data / "late").write_text("x\n")
    resolved = graph_confine.resolve(str(data / "late"))
    os.unlink(resolved)
    os.symlink(outside / "secret", resolved)
    with pytest.raises(OSError):
        open(resolved, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW))
    with pytest.raises(ComponentError):
        _reader(data / "late")._open()
    # Inside stays usable, through links that stay inside.
    _reader(data / "in-file")._open()
    writer = FileWriter(str(data / "in-ok" / "new"))
    writer._open()
    writer.close()
    assert (data / "real" / "new").exists()
    # Without a data directory (the SDK on a user's machine) paths are used as given.
    monkeypatch.delenv(graph_confine.ROOT_ENV)
    _reader(data / "out-file")._open()


async def test_part_names_cannot_lead_a_broker_run_outside(broker, tmp_path):  # noqa: F811
    """The attack of issue 30: links lnkp-T0, lnkp-T1 to outside files, read as
    `lnkp-T{part}`; an output `outp-T{part}` whose links lead outside."""
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for part in range(DEGREE):
        write_records(outside / f"t{part}", 3)
        (broker.data / f"lnkp-T{part}").symlink_to(outside / f"t{part}")
        (broker.data / f"outp-T{part}").symlink_to(outside / f"o{part}")
        write_records(broker.data / f"in.{part}", 3)

    def run(spec, run_id):
        return broker.stub.RunGraph(
            pb.RunGraphRequest(graph=to_proto(spec), run_id=run_id, reservation_id="g"),
            metadata=md,
        )

    ok = fig3a("in.{part}", "out.{part}", DEGREE)
    await _reserve(broker, md, ok, "g")
    for spec in (
        fig3a("lnkp-T{part}", "out.{part}", DEGREE),
        fig3a("in.{part}", "outp-T{part}", DEGREE),
    ):
        report = await fails(run(spec, "r"), C.INVALID_ARGUMENT)
        assert report.reason == "NOT_RUNNABLE_HERE"
        assert "-T0" in report.message and "leads outside" in report.message
        assert str(tmp_path) not in report.message, report.message
    # Inside, the run goes on as before, its workers confined to the data directory
    # (the open-time check above is theirs).
    assert worker_env(broker.data)[graph_confine.ROOT_ENV] == str(broker.data.resolve())
    await run(ok, "fine")
    ended = await _ended(broker, md, "fine")
    assert ended.state == pb.GRAPH_RUN_STATE_SUCCEEDED, ended.failure
    assert sorted(p.name for p in outside.iterdir()) == ["t0", "t1"]  # nothing written there
