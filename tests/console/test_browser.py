"""The console in a real browser (issue 21): headless Chromium (Debian's `chromium`, which
`python3 dev.py test` installs when it can) driven by Playwright's Python API against a real
local stack. Each view loads without a console error and is saved as a screenshot under
artefacts/console/; a job submitted and a block failed through the API change the open
block map without a reload; a tenant signed in cannot see another tenant's job.

Without a browser these tests skip and say why; the HTTP-level tests (test_http.py) still run.
"""

from __future__ import annotations

import base64
import hashlib
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from lightpath.security.identity import console_principal
from tests.console.conftest import ConsoleStack

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("console")]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = ROOT / "artefacts" / "console"
APT_NOTE = ROOT / ".venv" / ".lightpath-apt"  # what dev.py's install attempt said
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def why_no_browser() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    if not CHROMIUM.exists():
        note = APT_NOTE.read_text().strip() if APT_NOTE.exists() else ""
        return f"no browser: {CHROMIUM} is missing ({note or 'python3 dev.py test installs it with apt-get when run as root'})"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"no browser driver: the playwright package does not import ({exc})"
    return ""


def spki_hash(cert_path: Path) -> str:
    """base64 SHA-256 of a certificate's public key: Chromium trusts exactly that key."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.fixture(scope="module")
def browser(console_stack: ConsoleStack) -> Iterator:
    reason = why_no_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import Error, sync_playwright

    cert = console_stack.stack.ca.paths(console_principal()).cert
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(
                executable_path=str(CHROMIUM),
                args=[*FLAGS, f"--ignore-certificate-errors-spki-list={spki_hash(cert)}"],
            )
        except Error as exc:
            pytest.skip(f"no browser: {CHROMIUM} did not start under Playwright: {exc}")
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page of the console with every console error and page error it logs."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context(viewport={"width": 1366, "height": 768})
        self.page = self.context.new_page()
        self.url = url
        self.errors: list[str] = []
        # Chromium aborts requests in flight with net::ERR_NETWORK_CHANGED when any of the
        # host's interfaces changes: tests/test_compose_stack.py, on another worker, starts
        # dockerd's bridge and containers' veths. That is the host, not the console: such
        # aborts are kept apart, and every other error counts.
        self.network_changes: list[str] = []
        self.page.on("console", lambda m: self._error(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self._error(str(e)))

    def _error(self, text: str) -> None:
        (self.network_changes if NETWORK_CHANGED in text else self.errors).append(text)

    def open(self, fragment: str) -> None:
        from playwright.sync_api import Error

        try:
            self.page.goto(self.url + "#/" + fragment)
        except Error as exc:  # the same host event, once: a second one is a failure
            if NETWORK_CHANGED not in str(exc):
                raise
            self.network_changes.append(str(exc))
            self.page.goto(self.url + "#/" + fragment)

    def wait_live(self) -> None:
        """Until the view has drawn data from its event stream. (A selector, not a
        predicate: the console's Content-Security-Policy forbids the eval that Playwright's
        wait_for_function needs, and the tests run under the console's real policy.)"""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.wait_for_selector("body[data-updates]", state="attached", timeout=30_000)
        except PlaywrightTimeout:  # say what the page showed instead of data, and why
            shown = self.page.locator("body").inner_text(timeout=5_000)
            raise AssertionError(
                f"no update in 30 s; the page shows {shown!r}; console errors {self.errors}; "
                f"aborted by a host network change {self.network_changes}"
            ) from None

    def shot(self, name: str) -> Path:
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTEFACTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser, console_stack: ConsoleStack) -> Iterator[Page]:
    p = Page(browser, console_stack.url)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def jobs(console_stack: ConsoleStack) -> dict[str, str]:
    """A job on each kind of pod, one of them a tenant's."""
    out = {}
    with console_stack.cell() as cell:
        out["torus"] = cell.submit(f"big-{uuid.uuid4().hex[:4]}", (8, 8, 8)).job.job_id
        out["gpu"] = cell.submit(
            f"gpu-{uuid.uuid4().hex[:4]}", (4, 4, 8), node_type="gpu"
        ).job.job_id
        out["switched"] = cell.submit(
            f"sw-{uuid.uuid4().hex[:4]}", (36,), parallelism=(4, 9, 1)
        ).job.job_id
    with console_stack.cell("acme") as cell:
        out["acme"] = cell.submit(f"acme-{uuid.uuid4().hex[:4]}", (4, 4, 4)).job.job_id
    return out


def _pods(console_stack: ConsoleStack, jobs: dict[str, str]) -> dict[str, str]:
    with console_stack.cell() as cell:
        return {k: cell.get(j).pod_id for k, j in jobs.items()}


@pytest.mark.parametrize(
    "view",
    ["cell", "job", "pod-torus", "pod-gpu", "pod-switched", "ocs", "slice", "cores", "agg"],
)
def test_each_view_loads_without_console_errors(page: Page, console_stack, jobs, view):
    pods = _pods(console_stack, jobs)
    fragment = {
        "cell": "cell",
        "job": f"job/{jobs['torus']}",
        "pod-torus": f"pod/{pods['torus']}",
        "pod-gpu": f"pod/{pods['gpu']}",
        "pod-switched": f"pod/{pods['switched']}",
        "ocs": f"ocs/{pods['gpu']}",
        "slice": f"slice/{pods['torus']}/{jobs['torus']}",
        "cores": "cores",
        "agg": "agg",
    }[view]
    page.open(fragment)
    page.wait_live()
    main = page.page.locator("main")
    assert "Not available" not in main.inner_text()
    expected = {
        "cell": jobs["acme"],
        "job": "History",
        "pod-torus": jobs["torus"],
        "pod-gpu": jobs["gpu"],
        "pod-switched": "Groups and ring reservations",
        "ocs": "1×K switch states",
        "slice": "Cross-connects",
        "cores": "edge-0",
        "agg": "sub-2",
    }[view]
    assert expected in main.inner_text()
    page.shot(view)
    assert page.errors == []


def test_the_block_map_follows_a_submit_and_a_failure_without_a_reload(
    browser, console_stack: ConsoleStack
):
    """Both torus pods' maps are open before the submit (the cell picks the pod)."""
    from playwright.sync_api import expect

    job = f"live-{uuid.uuid4().hex[:6]}"
    pages = {pod: Page(browser, console_stack.url) for pod in ("pod-1", "pod-2")}
    try:
        for pod, p in pages.items():
            p.open(f"pod/{pod}")
            p.wait_live()
            p.page.evaluate("window.__sameDocument = true")
        with console_stack.cell() as cell:
            cell.submit(job, (8, 8, 4), node_type="tpu")
            started = time.monotonic()
            pod = cell.get(job).pod_id
            page = pages[pod]
            page.page.wait_for_selector(f'g.block[data-job="{job}"]', timeout=30_000)
            shown_job = time.monotonic() - started
            victim = int(
                page.page.locator(f'g.block[data-job="{job}"]').first.get_attribute("data-block")
            )
            cell.report_block_health(pod, victim, failed=True, reason="browser test")
            started = time.monotonic()
            page.page.wait_for_selector(
                f'g.block[data-block="{victim}"][data-health="FAILED"]', timeout=30_000
            )
            shown_failure = time.monotonic() - started
            # the running job was given another block in its place, and the map shows it
            expect(page.page.locator(f'g.block[data-job="{job}"]')).to_have_count(4, timeout=30_000)
            cross = page.page.locator(f'g.block[data-block="{victim}"] text', has_text="✕")
            assert cross.count() == 1
            assert page.page.evaluate("window.__sameDocument") is True  # never reloaded
            page.shot("pod-after-failure")
            cell.report_block_health(pod, victim, failed=False, reason="browser test")
        # measured, not asserted (bench/console.py measures it): kept beside the screenshots
        (ARTEFACTS / "block-map-latency.txt").write_text(
            f"job shown {shown_job:.3f} s after submit returned; "
            f"failure shown {shown_failure:.3f} s after the report\n"
        )
        assert [e for p in pages.values() for e in p.errors] == []
    finally:
        for p in pages.values():
            p.close()


def test_a_block_shows_its_job_and_segments(page: Page, console_stack, jobs):
    pod = _pods(console_stack, jobs)["torus"]
    page.open(f"pod/{pod}")
    page.wait_live()
    block = page.page.locator(f'g.block[data-job="{jobs["torus"]}"]').first
    block.hover()
    assert jobs["torus"] in page.page.locator(".tip").inner_text()
    block.click()
    detail = page.page.locator("#block-detail")
    detail.get_by_text("OCS port(s)").wait_for(timeout=30_000)
    text = detail.inner_text()
    assert jobs["torus"] in text and "ocs-" in text
    # job -> pod -> blocks -> OCS: the links are there
    detail.get_by_role("link", name="its slice's cross-connects →").click()
    page.page.get_by_role("heading", name="Cross-connects").wait_for(timeout=30_000)
    assert page.errors == []


def test_sub_block_boxes_failed_hosts_and_twisted_slices_show_on_the_block_map(
    page: Page, console_stack
):
    """Issue 28: a block shared by sub-block slices is drawn as its chips, each job's box
    in its colour, a failed host's chips hatched; a twisted torus is marked."""
    tag = uuid.uuid4().hex[:4]
    box, one, tw = f"box-{tag}", f"one-{tag}", f"tw-{tag}"
    with console_stack.cell() as cell:
        small = cell.submit(box, "2x2x1", pod="pod-1", require_pod=True).job
        cell.submit(one, "1x1x1", pod="pod-1", require_pod=True)
        cell.submit(tw, "4x4x8", twisted=True, pod="pod-1", require_pod=True)
        block = small.pod_job.box.block_id
        cell.report_block_health("pod-1", block, failed=True, host=15, reason="browser test")
        try:
            page.open("pod/pod-1")
            page.wait_live()
            shared = page.page.locator(f'g.block[data-block="{block}"]')
            shared.locator(f'rect.chip[data-job="{box}"]').first.wait_for(timeout=30_000)
            assert shared.locator(f'rect.chip[data-job="{box}"]').count() == 4
            assert page.page.locator(f'rect.chip[data-job="{one}"]').count() == 1
            assert shared.locator("rect.chip-failed").count() == 4  # host 15: 2x2x1 chips
            assert shared.get_attribute("data-failed-hosts") == "15"
            assert page.page.locator(f'g.block[data-job="{tw}"][data-twisted="true"]').count() == 2
            row = page.page.locator("main table tr", has_text=tw)
            assert "↻ twisted" in row.inner_text()
            assert "chips 2x2x1 at" in page.page.locator("main table tr", has_text=box).inner_text()
            shared.hover()
            tip = page.page.locator(".tip").inner_text()
            assert "shared by sub-block slices" in tip and "hosts 15 failed" in tip
            page.shot("pod-sub-block")
            page.open(f"job/{tw}")
            page.page.get_by_text("a twisted torus").first.wait_for(timeout=30_000)
            page.open(f"job/{box}")
            page.page.get_by_text("a box inside one block").wait_for(timeout=30_000)
            assert page.errors == []
        finally:
            cell.report_block_health("pod-1", block, failed=False, host=15, reason="browser test")
            for job in (box, one, tw):
                cell.complete(job)


def _fills(page: Page, selector: str, attr: str = "data-job") -> dict[str, set[str]]:
    """Each job's fill colours among the elements `selector` matches."""
    out: dict[str, set[str]] = {}
    for el in page.page.locator(selector).all():
        job = el.get_attribute(attr) or ""
        fill = el.locator("rect").first.get_attribute("fill") if el.locator("rect").count() else ""
        if job:
            out.setdefault(job, set()).add(fill or el.get_attribute("fill") or "")
    return out


def test_every_live_job_on_a_pod_has_its_own_colour(page: Page, console_stack):
    """Issue 33: colours came from a hash of the job id, and two jobs on pod-1 got the
    same. Five jobs on pod-2 (with what other tests left there): one colour each."""
    tag = uuid.uuid4().hex[:4]
    mine = [f"col-{tag}-{i}" for i in range(5)]
    with console_stack.cell() as cell:
        for job in mine:
            cell.submit(job, (4, 4, 4), pod="pod-2", require_pod=True, node_type="tpu")
        try:
            page.open("pod/pod-2")
            page.wait_live()
            for job in mine:
                page.page.locator(f'g.block[data-job="{job}"]').first.wait_for(timeout=30_000)
            fills = _fills(page, "g.block")
            assert set(mine) <= set(fills)
            assert all(len(f) == 1 for f in fills.values()), fills  # a job keeps one colour
            colours = [next(iter(f)) for f in fills.values()]
            assert len(set(colours)) == len(colours), fills
            # the live jobs table's swatch is the job's colour on the map
            for job in mine:
                swatch = page.page.locator("main table tr", has_text=job).locator("svg rect")
                assert swatch.get_attribute("fill") in fills[job]
            page.shot("pod-colours")
            assert page.errors == []
        finally:
            for job in mine:
                cell.complete(job)


# An SVG element's box on the page (Playwright's bounding_box answers None for SVG here).
BOX = "(e) => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width, height: r.height}; }"


def _boxes(locator) -> list[dict]:
    return locator.evaluate_all(f"(es) => es.map({BOX})")


def _boxes_overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_the_switched_pod_names_its_groups_and_draws_small_jobs(page: Page, console_stack, jobs):
    """Issue 33: on the SWITCHED pod job labels overlapped the processor grid and groups
    read "4, 5" beside tiles "g1.0 g1.1". Groups carry the rings table's names, labels
    sit clear of the processors, and a small job's tile is drawn on its processors."""
    small = f"swsmall-{uuid.uuid4().hex[:4]}"
    pod = _pods(console_stack, jobs)["switched"]
    with console_stack.cell() as cell:
        cell.submit(small, (4,), parallelism=(1, 4, 1), pod=pod, require_pod=True)
        try:
            page.open(f"pod/{pod}")
            page.wait_live()
            procs = page.page.locator(f'rect.proc[data-job="{small}"]')
            procs.first.wait_for(timeout=30_000)
            assert procs.count() == 4
            group = page.page.locator(f'g.group[data-small-jobs*="{small}"]')
            name = group.get_attribute("data-group")
            row = page.page.locator("main table tr", has_text=small)
            assert name and name in row.first.inner_text()  # the tiles column names it so
            panel = page.page.get_by_text("kept for small jobs").inner_text()
            assert name in panel and "groups g" in panel, panel
            for g in page.page.locator("g.group").all():
                texts, cells = _boxes(g.locator("text")), _boxes(g.locator("rect.proc"))
                assert texts and cells
                assert not any(_boxes_overlap(a, b) for a in texts for b in cells), (texts, cells)
                labels = g.locator("text").all_text_contents()
                assert g.get_attribute("data-group") in labels
            big = page.page.locator(f'g.group[data-job="{jobs["switched"]}"]')
            assert big.count() == 4 and jobs["switched"][-4:] in (big.first.text_content() or "")
            page.shot("pod-switched-small")
            assert page.errors == []
        finally:
            cell.complete(small)


def test_the_core_broker_timeline_fits_its_reservations(page: Page, console_stack):
    """Issue 33: a fixed 6-hour axis turned 10-minute reservations into slivers, and there
    was no table of reservations. The fixture's reservations last 10 to 20 minutes."""
    page.open("cores")
    page.wait_live()
    page.page.get_by_role("heading", name="Live reservations (3)").wait_for(timeout=30_000)
    ticks = page.page.locator("svg text.tick").all_text_contents()
    assert ticks[0] == "now" and all(t.endswith("min") for t in ticks[1:]), ticks
    plot = _boxes(page.page.locator("main svg rect").nth(0))[0]
    bar = _boxes(page.page.locator('g.resv[data-reservation="r-now"] rect'))[0]
    assert bar["width"] > 0.15 * plot["width"], (bar, plot)  # 10 of about 30 minutes
    table = page.page.locator("main table").first.inner_text()
    for rid in ("r-now", "r-later", "r-other"):
        assert rid in table
    assert "edge-0 ×10" in table and "SCHEDULED" in table and "ACTIVE" in table
    page.shot("cores-fitted")
    assert page.errors == []


def test_the_ocs_heat_map_labels_its_rows_and_columns(page: Page, console_stack):
    """Issue 33: unlabelled columns and every cell reading the same number without a word
    on why. Rows name the dimension, columns the axis (and k under it when K = 2)."""
    for pod, k in (("pod-1", 1), ("pod-2", 2)):
        page.open(f"ocs/{pod}")
        page.wait_live()
        switches = page.page.locator("g.switch")
        switches.first.wait_for(timeout=30_000)
        axes = {s.get_attribute("data-axis") for s in switches.all()}
        labels = page.page.locator("text.axis-label").all_text_contents()
        assert sorted(labels, key=int) == sorted(axes, key=int)
        assert page.page.locator("text.dim-label").all_text_contents() == [
            "x (dim 0)",
            "y (dim 1)",
            "z (dim 2)",
        ]
        assert ("k1" in (page.page.locator("svg.heat").text_content() or "")) == (k == 2)
        summary = page.page.locator("#ocs-summary").inner_text()
        assert "ports in use" in summary.lower() and "Unlike" not in summary, summary
        page.shot(f"ocs-{pod}")
    assert page.errors == []


def test_a_tenant_cannot_see_another_tenants_job(page: Page, console_stack, jobs):
    with console_stack.cell("globex") as cell:
        theirs = cell.submit(f"globex-{uuid.uuid4().hex[:4]}", (4, 4, 4)).job.job_id
    page.open("signin")
    page.page.fill("#token", console_stack.tokens["acme"])
    page.page.get_by_role("button", name="Sign in").click()
    page.page.get_by_text("signed in: token").wait_for(timeout=30_000)
    page.wait_live()
    table = page.page.locator("main table")
    table.get_by_role("link", name=jobs["acme"]).wait_for(timeout=30_000)
    assert theirs not in page.page.locator("main").inner_text()
    assert "globex" not in page.page.locator("main").inner_text()
    nav = page.page.locator("#nav").inner_text()  # no tab that answers "Not available"
    assert "Superpod" not in nav and "OCS" not in nav and "Cell" in nav, nav
    assert "Core broker" not in nav and "Aggregation" in nav, nav  # QueryCapacity: not a tenant's
    assert table.get_by_role("link", name="pod-", exact=False).count() == 0
    page.shot("cell-as-tenant")
    page.open("agg")  # its tree and commands; the switches' slots are the operators'
    page.page.get_by_text("operators' view").wait_for(timeout=30_000)
    assert "unreachable" not in page.page.locator("main").inner_text()
    page.shot("agg-as-tenant")
    page.open(f"job/{theirs}")
    alert = page.page.get_by_role("alert")
    alert.wait_for(timeout=30_000)
    assert "not found" in alert.inner_text()
    # the failed read is shown on the page; the browser logs the 404 of that read only
    assert all("404" in e for e in page.errors), page.errors


def test_without_a_browser_the_tests_say_why(monkeypatch, tmp_path):
    """On a machine without /usr/bin/chromium the browser tests skip with the reason, and
    the note dev.py left about its install attempt."""
    import tests.console.test_browser as me

    monkeypatch.setattr(me, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.setattr(me, "APT_NOTE", tmp_path / "note")
    assert f"{tmp_path / 'chromium'} is missing" in me.why_no_browser()
    assert "apt-get" in me.why_no_browser()
    (tmp_path / "note").write_text("`apt-get install chromium` failed (exit 100): no network\n")
    assert "no network" in me.why_no_browser()
    (tmp_path / "chromium").touch()
    assert me.why_no_browser() == ""


def test_the_cell_view_draws_each_tenants_quota_usage_and_borrowing(page: Page, console_stack):
    """Issue 35: per tenant and node type, a bar of the chips held against its quota."""
    from tests.console.test_http import ROOMY, quotas_set

    with console_stack.cell("acme") as cell:
        cell.submit(f"acme-{uuid.uuid4().hex[:4]}", (4, 4, 4))
    with quotas_set(console_stack, acme=ROOMY, globex={**ROOMY, "tpu": 777}):
        page.open("cell")
        page.wait_live()
        main = page.page.locator("main")
        assert "Tenants' quotas" in main.inner_text()
        bar = page.page.locator('.quota[data-tenant="globex"][data-type="tpu"] .bar')
        label = bar.get_attribute("aria-label") or ""  # (other tests' jobs may hold chips)
        assert re.fullmatch(r"\d+ of 777 tpu chips", label), label
        bars = page.page.locator('.quota[data-tenant="acme"] .bar')
        labels = [bars.nth(i).get_attribute("aria-label") or "" for i in range(bars.count())]
        assert all(" of 1048576 " in x for x in labels), labels
        assert any(not x.startswith("0 ") for x in labels), labels  # its job's chips
        page.shot("cell-quotas")
        assert page.errors == []
    # a quota on one pod: its own row, scoped
    from lightpath.v1 import cell_scheduler_pb2 as cs

    with console_stack.cell() as cell:
        cell.set_quota(cs.Quota(tenant="globex", pod="pod-2", nominal_chips={"tpu": 1 << 20}))
        try:
            page.open("cell")
            page.wait_live()
            bar = page.page.locator('.quota[data-tenant="globex"][data-pod="pod-2"] .bar')
            assert re.fullmatch(r"\d+ of 1048576 tpu chips", bar.get_attribute("aria-label") or "")
            assert "pod pod-2" in page.page.locator("main").inner_text()
        finally:
            cell.delete_quota("globex", "pod-2")


def test_a_view_whose_first_read_fails_recovers_when_the_service_answers_again(
    page: Page, console_stack
):
    """The OCS view of a pod whose ocs_manager is paused (SIGSTOP: a GC pause, a VM
    migration) cannot start: its event stream answers an error status, which a browser
    never reconnects by itself. The page says why and that it retries, and draws the view
    once the service answers again, without a reload. (CI once waited 30 s on a stuck
    'reconnecting…' here.)"""
    ocs = console_stack.stack.procs["ocs-pod-1"]
    ocs.send_signal(signal.SIGSTOP)
    try:
        page.open("ocs/pod-1")
        alert = page.page.get_by_role("alert")
        alert.wait_for(timeout=60_000)
        assert "retrying in" in alert.inner_text()
        assert "retrying" in page.page.locator("#live").inner_text()
        assert page.page.locator("body[data-updates]").count() == 0
    finally:
        ocs.send_signal(signal.SIGCONT)
    page.wait_live()
    page.page.locator("g.switch").first.wait_for(timeout=30_000)
    assert page.page.get_by_role("alert").count() == 0
    # only the failed loads while it was paused, nothing the page's code threw
    assert all("Failed to load resource" in e for e in page.errors), page.errors


def test_the_cell_view_says_which_pod_is_held_and_for_whom_only_to_whom_may_know(
    page: Page, console_stack
):
    """Issue 35's hold in the cell view: acme's job waits for quota in the cell queue and
    a pod is held for it (written as the dispatcher writes it, CellStore.hold_pod); the
    operator sees which pod, for whose job, linked; another tenant sees that the pod is
    held, never acme's name or job."""
    import asyncio
    import concurrent.futures

    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath_services.cell_scheduler.store import CellStore
    from lightpath_services.common.redis_store import connect, read_password

    stack = console_stack.stack
    job_id = f"acme-held-{uuid.uuid4().hex[:4]}"

    async def held(hold: bool) -> None:
        redis = connect(stack.redis_url, password=read_password(stack.redis_password_file))
        try:
            store = CellStore(redis)
            if hold:
                assert await store.hold_pod(job_id, "pod-1", "acme", int(time.time() * 1000))
            else:
                await store.release_pod(job_id)
        finally:
            await redis.aclose()

    def in_thread(coro) -> None:  # (Playwright's sync API runs a loop in this one)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, coro).result()

    with console_stack.cell() as cell:
        cell.set_quota(cs.Quota(tenant="acme", nominal_chips={"tpu": 64}, no_borrowing=True))
        try:
            with console_stack.cell("acme") as acme:
                waiting = acme.submit(job_id, (4, 4, 8)).job  # over acme's quota: it waits
            assert not waiting.pod_id and "quota" in waiting.reason, waiting.reason
            in_thread(held(True))
            page.open("cell")
            page.wait_live()
            note = page.page.locator('.hold[data-pod="pod-1"]')
            note.wait_for(timeout=30_000)
            text = note.inner_text()
            assert f"Pod pod-1 is held for acme's job {job_id}" in text, text
            assert "jobs that would borrow quota stay off this pod" in text, text
            assert note.get_by_role("link", name=job_id).get_attribute("href") == f"#/job/{job_id}"
            page.shot("cell-hold")
            page.open("signin")
            page.page.fill("#token", console_stack.tokens["globex"])
            page.page.get_by_role("button", name="Sign in").click()
            page.page.get_by_text("signed in: token").wait_for(timeout=30_000)
            page.open("cell")
            page.wait_live()
            note.wait_for(timeout=30_000)
            text = note.inner_text()
            assert "is held for another tenant's job" in text, text
            assert "acme" not in page.page.locator("main").inner_text()
            assert page.errors == []
        finally:
            in_thread(held(False))
            cell.cancel(job_id)
            cell.delete_quota("acme")
