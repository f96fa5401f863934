from __future__ import annotations

import argparse

import pytest

from lightpath.cli import build_parser, main
from tests.helpers import PATENT_REFERENCE


def test_help_lists_the_stack_commands(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in ("up", "status", "demo"):
        assert command in out


def test_status_without_a_stack_says_so(tmp_path, capsys):
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"no stack at {tmp_path} (--state-dir); start one with `lightpath up`" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--as", "acme", "jobs"],
        ["jobs", "--as", "acme"],
        ["submit", "j1", "--shape", "4x4x4", "--as", "acme"],
        ["tenant", "list", "--as", "acme"],
        ["agg", "topology", "--as", "acme"],
    ],
)
def test_as_is_global_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).as_identity == "acme"


def test_without_as_there_is_no_identity():
    assert build_parser().parse_args(["jobs"]).as_identity is None
    # given before the command and not after, the subcommand keeps it
    assert build_parser().parse_args(["--as", "beta", "tenant", "list"]).as_identity == "beta"


def test_help_names_the_identity_settings(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for name in (
        "--as IDENTITY",
        "LIGHTPATH_TLS_CA",
        "LIGHTPATH_TOKEN_FILE",
        "LIGHTPATH_STATE_DIR",
    ):
        assert name in out
    for command in ("tenant", "token", "audit", "whoami"):
        assert command in out


def test_with_nothing_listening_the_error_names_the_address_its_setting_and_lightpath_up(
    monkeypatch, capsys
):
    from lightpath.embedded_redis import free_port

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", address)
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert err.count("error: UNAVAILABLE") == 1
    assert f"next: nothing answers at {address}, taken from LIGHTPATH_CELL_ADDR\n" in err
    assert "next: start a local stack with `lightpath up`" in err


def test_the_default_address_says_where_it_came_from(tmp_path, monkeypatch):
    from lightpath.stack import located

    monkeypatch.delenv("LIGHTPATH_CELL_ADDR", raising=False)
    address, source = located("cell-scheduler", "LIGHTPATH_CELL_ADDR", tmp_path)
    assert address == "127.0.0.1:50051"
    assert source == (
        f"the local stack's default port: no stack is running in {tmp_path} "
        "and LIGHTPATH_CELL_ADDR is unset"
    )
    monkeypatch.setenv("LIGHTPATH_CELL_ADDR", "cell.example:443")
    assert located("cell-scheduler", "LIGHTPATH_CELL_ADDR", tmp_path) == (
        "cell.example:443",
        "LIGHTPATH_CELL_ADDR",
    )


def _arguments(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, what, help text) of every command and argument, at every depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield (*path, choice.dest), "command", choice.help
            for name, child in action.choices.items():
                yield from _arguments(child, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_has_help_and_no_help_cites_the_patents():
    seen = list(_arguments(build_parser()))
    assert len(seen) > 200  # every command of every topic was walked
    missing = [(" ".join(p), what) for p, what, text in seen if not text]
    assert missing == []
    cited = [
        (" ".join(p), what, text)
        for p, what, text in seen
        if text and text != argparse.SUPPRESS and PATENT_REFERENCE.search(text)
    ]
    assert cited == []


def test_completion_follows_the_parser(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -o default -F _lightpath_complete lightpath" in script
    assert "lightpath __complete" in script
    assert main(["completion", "zsh"]) == 0
    assert capsys.readouterr().out.startswith("autoload -U +X bashcompinit")

    def complete(*words: str) -> list[str]:
        assert main(["__complete", *words]) == 0
        return capsys.readouterr().out.splitlines()

    top = complete()
    assert {"submit", "jobs", "cores", "agg", "completion", "--as"} <= set(top)
    assert "__complete" not in top
    assert {"reserve", "extend", "release", "list"} <= set(complete("cores"))
    assert {"--all", "--page-token", "--output", "--no-headers", "--state"} <= set(complete("jobs"))
    assert complete("submit", "j1", "--class") == ["high", "low", "medium"]
    assert complete("jobs", "-o") == ["table", "wide", "json", "yaml", "name", "jsonpath="]
    assert complete("-o", "yaml", "job", "-o") == complete("jobs", "-o")
    assert main(["completion", "fish"]) == 0
    assert "complete -c lightpath -f -a '(__lightpath_complete)'" in capsys.readouterr().out
    assert {"--all", "--page-token"} <= set(complete("--as", "acme", "cores", "list"))


def test_up_on_a_taken_port_fails_at_once_naming_the_port_and_its_holder(tmp_path, capsys):
    import os
    import socket

    from lightpath.stack import ProcessSpec, Stack, StackError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        stack = Stack(
            tmp_path,
            specs=[ProcessSpec("cell-scheduler", "cell_scheduler", port)],
            redis_port=0,
            log=lambda *_: None,
        )
        with pytest.raises(StackError) as err:
            stack.start()
    message = str(err.value)
    assert f"port {port} (cell-scheduler) is held by pid {os.getpid()} (" in message
    assert "`lightpath up --ephemeral-ports`" in message
    assert not (tmp_path / "logs").exists()  # nothing was started


# -- issue 28: sub-block slices, twisted tori, host health --------------------------------


def _shared_view():
    from lightpath.v1 import common_pb2 as c
    from lightpath.v1 import workload_scheduler_pb2 as w

    view = w.PodView(
        pod_id="pod-1",
        block_shape=c.Shape(dims=[4, 4, 4]),
        host_shape=c.Shape(dims=[2, 2, 1]),
        block_count=8,
        ocs_per_axis=1,
    )

    def box(job: str, block: int, at: list[int], chips: list[int]) -> w.ChipBox:
        return w.ChipBox(
            block_id=block, offset=c.Coordinate(coords=at), chips=c.Shape(dims=chips), job_id=job
        )

    alloc = c.BLOCK_AVAILABILITY_ALLOCATED
    for b in range(8):
        view.blocks.append(w.BlockView(block_id=b, node_type="tpu", chips_free=64))
    view.blocks[0].job_id = view.blocks[1].job_id = "big"
    view.blocks[0].availability = view.blocks[1].availability = alloc
    view.blocks[5].availability = alloc
    view.blocks[5].boxes.extend(
        [box("small", 5, [0, 2, 0], [2, 2, 1]), box("one", 5, [2, 0, 0], [1, 1, 1])]
    )
    view.blocks[5].chips_free = 59
    view.blocks[6].failed_hosts.append(3)  # a failed host: the block counts as failed too
    view.blocks[6].health = c.BLOCK_HEALTH_FAILED
    view.blocks[7].health = c.BLOCK_HEALTH_FAILED  # failed as a whole block
    view.blocks[6].chips_free = 60
    view.live_jobs.extend(
        [
            w.JobSummary(
                job_id="big", state=c.JOB_STATE_RUNNING, priority=50, grid=c.Shape(dims=[1, 1, 2])
            ),
            w.JobSummary(
                job_id="small", state=c.JOB_STATE_RUNNING, priority=50, grid=c.Shape(dims=[1, 1, 1])
            ),
            w.JobSummary(
                job_id="one", state=c.JOB_STATE_RUNNING, priority=20, grid=c.Shape(dims=[1, 1, 1])
            ),
        ]
    )
    view.types.append(
        w.TypeCounts(
            node_type="tpu",
            total=8,
            free=4,
            allocated=3,
            failed=1,
            chips_total=512,
            chips_used=133,
            chips_failed=4,
            chips_free=375,
        )
    )
    return view


def test_the_block_map_shows_shared_blocks_their_boxes_and_failed_hosts():
    from lightpath.cli.pod import render_pod

    out = render_pod(_shared_view(), twisted={"big"})
    row = out.splitlines()[3].split()
    assert row[1:] == ["A", "A", ".", ".", ".", "+", "!", "X"]
    assert "+ shared by sub-block slices   ! a host failed" in out
    assert "B  small  RUNNING  priority 50  chips 2x2x1 at (0,2,0) of block 5, a mesh" in out
    assert "C  one  RUNNING  priority 20  chips 1x1x1 at (2,0,0) of block 5, a mesh" in out
    assert "A  big  RUNNING  priority 50  1x1x2 blocks, a twisted torus" in out
    assert "sub-block blocks (hosts of 2x2x1 chips):" in out
    assert "  block 5: 59 chips free; B(0,2,0)2x2x1 C(2,0,0)1x1x1" in out
    assert "  block 6: 60 chips free, hosts 3 failed" in out
    assert "chips:  tpu 512 (375 free, 133 used, 4 failed)" in out


def test_a_job_says_where_its_box_is_or_that_it_is_a_twisted_torus():
    from lightpath.cli.cell import describe_job
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import common_pb2 as c
    from lightpath.v1 import workload_scheduler_pb2 as w

    small = cs.CellJob(
        job_id="small",
        tenant="default",
        state=c.JOB_STATE_RUNNING,
        pod_id="pod-1",
        priority=50,
        chips=c.Shape(dims=[2, 2, 1]),
    )
    small.pod_job.box.CopyFrom(
        w.ChipBox(block_id=17, offset=c.Coordinate(coords=[0, 2, 0]), chips=c.Shape(dims=[2, 2, 1]))
    )
    out = describe_job(small)
    assert "RUNNING on pod-1, priority 50, 2x2x1 chips (a box inside one block)" in out
    assert "  box:    chips 2x2x1 at (0,2,0) of block 17, a mesh, no OCS change" in out
    twisted = cs.CellJob(
        job_id="tw",
        tenant="default",
        state=c.JOB_STATE_RUNNING,
        pod_id="pod-1",
        chips=c.Shape(dims=[4, 4, 8]),
        block_count=2,
        spec=w.JobSpec(job_id="tw", twisted=True),
    )
    assert "4x4x8 chips (2 blocks), a twisted torus" in describe_job(twisted)
    queued = cs.CellJob(job_id="q", state=c.JOB_STATE_PENDING, chips=c.Shape(dims=[2, 2, 1]))
    assert describe_job(queued).endswith("priority 0, 2x2x1 chips")


def test_submit_and_block_take_the_new_flags_and_refuse_a_bad_host_naming_the_flag(capsys):
    from lightpath.cli.cell import submit_options

    args = build_parser().parse_args(["submit", "j", "--shape", "4x4x8", "--twisted"])
    assert submit_options(args)["twisted"] is True and submit_options(args)["shape"] == [4, 4, 8]
    args = build_parser().parse_args(["submit", "j", "--shape", "2x2x1"])
    assert submit_options(args)["shape"] == [2, 2, 1] and submit_options(args)["twisted"] is False
    args = build_parser().parse_args(["block", "pod-1", "7", "--failed", "--host", "3"])
    assert (args.host, args.failed) == (3, True)
    assert build_parser().parse_args(["block", "pod-1", "7", "--healthy"]).host is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["block", "pod-1", "7", "--failed", "--host", "-1"])
    assert "argument --host: '-1' is not a host index" in capsys.readouterr().err


def test_a_refused_field_is_named_with_the_flag_that_sets_it(capsys):
    from lightpath.cli._common import report_error
    from lightpath.cli.cell import SUBMIT_FLAGS
    from lightpath.errors import FieldViolation, InvalidArgument

    err = InvalidArgument.of(
        [
            FieldViolation("spec.twisted", "4x8x12 cannot be twisted"),
            FieldViolation("spec.shape.dims[0]", "must be >= 1"),
        ]
    )
    report_error(err, flags=SUBMIT_FLAGS)
    out = capsys.readouterr().err
    assert "--twisted (spec.twisted): 4x8x12 cannot be twisted" in out
    assert "--shape (spec.shape.dims[0]): must be >= 1" in out
    assert out.count("4x8x12 cannot be twisted") == 1


def test_a_host_report_says_which_sub_block_slices_moved():
    from lightpath.cli.cell import describe_block_report
    from lightpath.v1 import common_pb2 as c
    from lightpath.v1 import workload_scheduler_pb2 as w

    def box(at: list[int]) -> w.ChipBox:
        return w.ChipBox(
            block_id=63, offset=c.Coordinate(coords=at), chips=c.Shape(dims=[2, 2, 1]), job_id="s"
        )

    resp = w.ReportBlockHealthResponse(action="job s moved off failed chips", affected_jobs=["s"])
    resp.moved.add(job_id="s", to=box([0, 2, 0]))
    getattr(resp.moved[0], "from").CopyFrom(box([0, 0, 0]))
    resp.block.block_id, resp.block.chips_free = 63, 54
    resp.block.failed_hosts.append(0)
    assert describe_block_report("pod-1", 63, 0, resp).splitlines() == [
        "pod pod-1 block 63 host 0: job s moved off failed chips",
        "  moved s: chips 2x2x1 at (0,0,0) of block 63 -> (0,2,0) of block 63",
        "  block 63: hosts 0 failed, 54 chips free for sub-block slices",
        "  affected: s",
    ]


def test_one_spelling_per_value_in_the_cli_and_the_console():
    """Issue 33: a value reads the same in a table, a message and the console (the enum's
    name without its prefix), and the aggregation commands no longer say state_running."""
    from lightpath.cli._common import short_name
    from lightpath.sdk.cell import job_state, state_name
    from lightpath.v1 import agg_switch_pb2, cell_scheduler_pb2, common_pb2
    from lightpath_services.console.views import enum_name

    for enum, prefix in (
        (common_pb2.JobState, "JOB_STATE_"),
        (common_pb2.FabricKind, "FABRIC_KIND_"),
        (cell_scheduler_pb2.PodStatus, "POD_STATUS_"),
        (agg_switch_pb2.AggNodeKind, "AGG_NODE_KIND_"),
        (agg_switch_pb2.AggCommandState, "AGG_COMMAND_STATE_"),
    ):
        for value in enum.values():
            assert short_name(enum, value) == enum_name(enum, value, prefix)
    assert short_name(agg_switch_pb2.AggNodeKind, agg_switch_pb2.AGG_NODE_KIND_SWITCH) == "SWITCH"
    assert state_name(common_pb2.JOB_STATE_RUNNING) == "RUNNING"
    assert job_state("running") == job_state("RUNNING") == common_pb2.JOB_STATE_RUNNING
