from __future__ import annotations

import pytest

from lightpath.cli import build_parser, main


def test_help_lists_the_stack_commands(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for command in ("up", "status", "demo"):
        assert command in out


def test_status_without_a_stack_says_so(tmp_path, capsys):
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    assert "no stack running" in capsys.readouterr().out
