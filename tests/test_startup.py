"""lightpath.startup: a process's start-up imports without the garbage collector (issue 31)."""

from __future__ import annotations

import gc
import sys

import pytest

from lightpath.cli import main
from lightpath.startup import imports_without_gc


@pytest.fixture(autouse=True)
def _collector_restored():
    """Each test leaves the worker's collector as it found it (on, nothing frozen)."""
    was_enabled = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def _tracked(obj: object) -> bool:
    """`obj` is in one of the collector's generations (frozen objects are in none)."""
    return any(o is obj for o in gc.get_objects())


def test_collector_off_inside_and_what_was_made_frozen_after():
    with imports_without_gc():
        assert not gc.isenabled()
        made = [object()]
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert not _tracked(made)
    later = [object()]
    assert _tracked(later)  # frozen once, at the end: what comes after is collected as usual


def test_an_import_that_raises_still_turns_the_collector_back_on():
    with pytest.raises(ImportError), imports_without_gc():
        raise ImportError("no module named nowhere")
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0


def test_a_collector_switched_off_before_stays_off():
    gc.disable()
    with imports_without_gc():
        pass
    assert not gc.isenabled()


def test_cli_called_in_process_leaves_the_collector_alone(capsys):
    assert main(["completion", "bash"]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_cli_as_the_process_entry_imports_without_the_collector(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightpath", "completion", "bash"])
    assert main() == 0
    assert "complete" in capsys.readouterr().out
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
