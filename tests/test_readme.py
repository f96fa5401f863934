"""The README opens with the two set-up commands and documents every setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.common.settings import describe
from tests.helpers import SERVICES, settings_class

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]
    assert README.index("python3 dev.py demo") < README.index("## ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec python3 dev.py test" in ci and "pytest" not in ci


@pytest.mark.parametrize("service", SERVICES)
def test_every_setting_is_in_the_configuration_table(service):
    for doc in describe(settings_class(service)):
        assert f"`{doc.env}`" in README, (
            f"{doc.env} ({service}) is missing from the README's configuration table"
        )


def test_every_console_setting_is_in_the_configuration_table():
    from services.console.settings import ConsoleSettings

    for doc in describe(ConsoleSettings):
        assert f"`{doc.env}`" in README, (
            f"{doc.env} (console) is missing from the README's configuration table"
        )
