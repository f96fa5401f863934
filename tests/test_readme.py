"""The README opens with the two set-up commands, stays short (issue 33: a newcomer reads
it in five minutes), links only within the repository, says where the apt step happens,
and keeps a benchmark table of real benches; docs/configuration.md documents every
setting; no document points at something a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from lightpath_services.common.settings import describe
from tests.helpers import SERVICES, settings_class

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Addresses on the operator's own machine (the local stack's console) are not links out.
LOOPBACK = {"127.0.0.1", "localhost", "[::1]"}


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]
    assert README.index("python3 dev.py demo") < README.index("## ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec python3 dev.py test" in ci and "pytest" not in ci


def test_readme_is_short_and_in_the_order_a_newcomer_reads():
    assert len(README) < 12_000, f"the README is {len(README)} characters: move detail to docs/"
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings[:2] == ["What it is", "Day one"], headings
    assert headings[-1] == "More"
    assert "![" in README  # a picture
    assert "| variable |" not in README  # the variable table lives in docs/configuration.md


def test_readme_says_where_the_apt_step_happens():
    dev = (ROOT / "dev.py").read_text()
    assert "apt-get\ninstall chromium prometheus docker.io debootstrap" in README
    assert "ensure_system_tools" in README and "def ensure_system_tools" in dev
    assert '"apt-get", "install"' in dev


def _links(markdown: str) -> list[str]:
    inline = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", markdown)
    auto = re.findall(r"<(https?://[^>]+)>", markdown)
    return inline + auto


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_no_link_leaves_the_repository(path):
    """Every link is a file of the repository (or a section of one), or the operator's
    own machine; nothing points at a sibling directory, another host or another clone."""
    text = path.read_text()
    for link in _links(text):
        url = urlparse(link)
        if url.scheme in ("http", "https"):
            assert url.hostname in LOOPBACK or f"[{url.hostname}]" in LOOPBACK, (
                f"{path.name} links out of the repository: {link}"
            )
            continue
        assert not url.scheme, f"{path.name}: {link}"
        if not url.path:
            continue  # a section of the same page
        target = (path.parent / url.path).resolve()
        assert target.is_relative_to(ROOT), f"{path.name} links outside the repository: {link}"
        assert target.exists(), f"{path.name} links to a missing file: {link}"


def test_links_the_requirements_and_nothing_a_clone_cannot_resolve():
    for path in [ROOT / "README.md", *DOCS]:
        text = path.read_text()
        for outside in ("../shared", "/work/shared", "SPEC.md"):
            assert outside not in text, f"{path.name} points at {outside}"
    assert "¶" not in README  # paragraphs of the source designs: docs/requirements.md
    assert "docs/requirements.md" in README
    requirements = (ROOT / "docs" / "requirements.md").read_text()
    cited = set()
    for path in [*ROOT.glob("lightpath/**/*.py"), *ROOT.glob("services/**/*.py"), *DOCS]:
        cited |= set(re.findall(r"\b(?:CS|WS|OCS|SW|CB|GF|AG|X)-\d+\b", path.read_text()))
    missing = sorted(r for r in cited if f"**{r}**" not in requirements)
    assert not missing, f"docs/requirements.md does not summarise {missing}"


def test_the_benchmark_table_names_real_benches():
    table = README[README.index("## Benchmarks") :]
    table = table[: table.index("\n## ")]
    assert "| bench | what | target | measured |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row.split("|")[1].strip().rstrip("*†°‡§") for row in rows[1:]]
    assert names
    for name in names:
        if name:  # a continuation row of the bench above
            assert (ROOT / "bench" / f"{name}.py").exists(), f"no bench/{name}.py"


@pytest.mark.parametrize("service", SERVICES)
def test_every_setting_is_in_the_configuration_table(service):
    for doc in describe(settings_class(service)):
        assert f"`{doc.env}`" in CONFIGURATION, (
            f"{doc.env} ({service}) is missing from docs/configuration.md's table"
        )


def test_every_console_setting_is_in_the_configuration_table():
    from lightpath_services.console.settings import ConsoleSettings

    for doc in describe(ConsoleSettings):
        assert f"`{doc.env}`" in CONFIGURATION, (
            f"{doc.env} (console) is missing from docs/configuration.md's table"
        )
