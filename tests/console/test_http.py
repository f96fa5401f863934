"""The console over real HTTPS against a real local stack (issue 21): its certificate and
identity, loopback only, its headers, what a viewer sees without and with a sign-in, a
tenant confined to its own jobs, live updates as server-sent events, clear errors."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import grpc
import httpx
import psutil
import pytest
from cryptography import x509

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.security.credentials import Credentials
from lightpath.security.identity import console_principal
from lightpath.stack import console_env, console_health
from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc
from lightpath_services.console.app import CSP
from tests.console.conftest import ConsoleStack

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("console")]


def _job(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _events(client: httpx.Client, path: str) -> Iterator[tuple[str, dict]]:
    """(event, data) of a server-sent event stream, as they come."""
    with client.stream("GET", path, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        event, data = "", ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and event:
                yield event, json.loads(data)
                event, data = "", ""


def test_serves_https_with_its_own_identity_on_loopback_only(console_stack: ConsoleStack):
    url = console_stack.url
    assert url.startswith("https://127.0.0.1:")
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    ctx = ssl.create_default_context(cafile=str(console_stack.ca))
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert console_principal().uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
    # nothing but HTTPS: a plaintext request gets no page
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        raw.settimeout(5)
        try:
            reply = raw.recv(200)
        except (ConnectionResetError, TimeoutError):
            reply = b""
    assert b"Lightpath" not in reply
    # the console process listens on loopback only
    proc = psutil.Process(console_stack.stack.procs["console"].pid)
    listening = [c.laddr for c in proc.net_connections() if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
    assert console_health(url, console_stack.ca) == "SERVING"


def test_status_json_shows_the_console_url(console_stack: ConsoleStack):
    state_dir = console_stack.stack.state_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_TLS_")}
    out = subprocess.run(
        [sys.executable, "-m", "lightpath", "status", "--json", "--state-dir", str(state_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    status = json.loads(out.stdout)
    assert status["console"] == {
        "url": console_stack.url,
        "health": "SERVING",
        "metrics": console_stack.stack.metrics_endpoints["console"],
    }
    assert out.returncode == 0


def test_the_page_and_its_assets_come_from_the_console_alone(console_stack: ConsoleStack):
    with console_stack.http() as client:
        page = client.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-frame-options"] == "DENY"
        assets = ["/static/console.js", "/static/console.css", "/static/icon.svg"]
        for asset in assets:
            assert f'"{asset}"' in page.text
            resp = client.get(asset)
            assert resp.status_code == 200, asset
            # no CDN, no other origin: nothing in the assets points off the console
            assert "http://" not in resp.text.replace("http://www.w3.org/2000/svg", "")
            assert "https://" not in resp.text
        assert "http" not in page.text.replace("http-equiv", "")


def test_without_sign_in_the_console_shows_everything_read_only(console_stack: ConsoleStack):
    a, g = _job("acme"), _job("globex")
    with console_stack.cell("acme") as cell:
        cell.submit(a, (4, 4, 4))
    with console_stack.cell("globex") as cell:
        cell.submit(g, (4, 4, 4))
    with console_stack.http() as client:
        assert client.get("/api/session").json()["anonymous_reads"] is True
        view = client.get("/api/view/cell").json()
        jobs = {j["job_id"]: j for j in view["jobs"]}
        assert jobs[a]["tenant"] == "acme" and jobs[g]["tenant"] == "globex"
        assert {p["pod_id"] for p in view["pods"]} == {"pod-1", "pod-2", "pod-3"}
        pod = client.get("/api/view/pod", params={"id": jobs[a]["pod_id"]}).json()
        assert {b["block_id"] for b in pod["blocks"] if b["job_id"] == a}
        # no route changes anything: every write method is refused
        for path in ("/api/view/cell", "/events/cell"):
            assert client.post(path).status_code == 405
            assert client.delete(path).status_code == 405


def test_the_consoles_own_identity_cannot_change_anything(console_stack: ConsoleStack):
    files = console_stack.stack.ca.paths(console_principal())
    creds = Credentials.from_files(files.ca, files.cert, files.key)

    async def submit() -> grpc.StatusCode:
        async with channel(
            console_stack.stack.endpoints["cell-scheduler"], credentials=creds, max_attempts=1
        ) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            await stub.ListPods(cell_scheduler_pb2.ListPodsRequest())  # it may read
            try:
                await stub.CancelJob(cell_scheduler_pb2.CancelCellJobRequest(job_id="any"))
            except grpc.aio.AioRpcError as err:
                return err.code()
            return grpc.StatusCode.OK

    import asyncio

    assert asyncio.run(submit()) == grpc.StatusCode.PERMISSION_DENIED


def test_a_tenant_signed_in_sees_only_its_own_jobs(console_stack: ConsoleStack):
    mine, theirs = _job("acme"), _job("globex")
    with console_stack.cell("acme") as cell:
        cell.submit(mine, (4, 4, 4))
    with console_stack.cell("globex") as cell:
        cell.submit(theirs, (4, 4, 4))
    origin = console_stack.url.rstrip("/")
    with console_stack.http() as client:
        resp = client.post(
            "/api/login", json={"token": console_stack.tokens["acme"]}, headers={"Origin": origin}
        )
        assert resp.status_code == 200, resp.text
        cookie = resp.headers["set-cookie"].lower()
        assert "httponly" in cookie and "secure" in cookie and "samesite=strict" in cookie
        assert console_stack.tokens["acme"] not in resp.text + resp.headers["set-cookie"]
        assert client.get("/api/session").json()["signed_in"] is True
        view = client.get("/api/view/cell").json()
        tenants = {j["tenant"] for j in view["jobs"]}
        assert tenants == {"acme"}
        assert mine in {j["job_id"] for j in view["jobs"]}
        assert "may not call ListPods" in view["pods_error"] and view["pods"] == []
        # another tenant's job is not found for this tenant, as through the API
        other = client.get("/api/view/job", params={"id": theirs})
        assert other.status_code == 404 and other.json()["error"]["code"] == "NOT_FOUND"
        own = client.get("/api/view/job", params={"id": mine}).json()
        assert own["tenant"] == "acme" and len(own["trace_id"]) == 32
        # a pod's block map is the operators'
        pod = client.get("/api/view/pod", params={"id": "pod-1"})
        assert pod.status_code == 403 and pod.json()["error"]["code"] == "PERMISSION_DENIED"
        # the live stream is filtered the same way
        event, data = next(_events(client, "/events/cell"))
        assert event == "view" and {j["tenant"] for j in data["jobs"]} == {"acme"}
        # signing out returns to the console's own view
        assert client.post("/api/logout", headers={"Origin": origin}).status_code == 200
        assert client.get("/api/session").json()["signed_in"] is False
        view = client.get("/api/view/cell").json()
        assert {"acme", "globex"} <= {j["tenant"] for j in view["jobs"]}


@contextlib.contextmanager
def quotas_set(console_stack: ConsoleStack, **nominal: dict[str, int]) -> Iterator[None]:
    """Tenants' quotas for one test, removed after it (the stack is shared)."""
    from lightpath.v1 import cell_scheduler_pb2 as cs

    with console_stack.cell() as cell:
        for tenant, chips in nominal.items():
            cell.set_quota(cs.Quota(tenant=tenant, nominal_chips=chips))
        try:
            yield
        finally:
            for tenant in nominal:
                cell.delete_quota(tenant)


# Large enough that no other test's job waits for them (every node type of the stack).
ROOMY = {"tpu": 1 << 20, "gpu": 1 << 20, "npu": 1 << 20}


def test_the_cell_view_shows_each_tenants_quota_and_a_tenant_its_own_only(
    console_stack: ConsoleStack,
):
    mine = _job("acme")
    with console_stack.cell("acme") as cell:
        cell.submit(mine, (4, 4, 4))
    origin = console_stack.url.rstrip("/")
    with (
        quotas_set(console_stack, acme=ROOMY, globex={**ROOMY, "tpu": 777}),
        console_stack.http() as client,
    ):
        rows = {q["tenant"]: q for q in client.get("/api/view/cell").json()["quotas"]}
        assert {"acme", "globex"} <= set(rows)
        tpu = {t["node_type"]: t for t in rows["globex"]["types"]}["tpu"]
        assert tpu["quota"] == 777 and rows["globex"]["has_quota"]
        held = {t["node_type"]: t for t in rows["acme"]["types"]}
        assert sum(t["used"] for t in held.values()) >= 64  # its job's chips
        resp = client.post(
            "/api/login", json={"token": console_stack.tokens["acme"]}, headers={"Origin": origin}
        )
        assert resp.status_code == 200, resp.text
        view = client.get("/api/view/cell")
        assert [q["tenant"] for q in view.json()["quotas"]] == ["acme"]
        assert "globex" not in view.text  # no other tenant's name, nor its quota


def test_sign_in_refuses_bad_tokens_and_other_origins(console_stack: ConsoleStack):
    origin = console_stack.url.rstrip("/")
    with console_stack.http() as client:
        bad = client.post(
            "/api/login", json={"token": "lpt1.00.forged"}, headers={"Origin": origin}
        )
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        assert bad.json()["error"]["code"] == "UNAUTHENTICATED"
        empty = client.post("/api/login", json={}, headers={"Origin": origin})
        assert empty.status_code == 400 and "'token'" in empty.json()["error"]["message"]
        cross = client.post(
            "/api/login",
            json={"token": console_stack.tokens["acme"]},
            headers={"Origin": "https://evil.example"},
        )
        assert cross.status_code == 403 and "set-cookie" not in cross.headers
        assert client.get("/api/session").json()["signed_in"] is False


def test_bad_requests_name_the_parameter_and_the_rule(console_stack: ConsoleStack):
    with console_stack.http() as client:
        resp = client.get("/api/view/pod", params={"id": "no such pod!"})
        assert resp.status_code == 400
        assert "'id'" in resp.json()["error"]["message"]
        resp = client.get("/api/view/pod", params={"id": "pod-9"})
        assert resp.status_code == 404 and "pod-9" in resp.json()["error"]["message"]
        resp = client.get("/api/view/nonsense")
        assert resp.status_code == 400 and "cell, job, pod" in resp.json()["error"]["message"]
        resp = client.get("/api/view/block", params={"pod": "pod-1", "id": "64"})
        assert resp.status_code == 400 and "0..63" in resp.json()["error"]["message"]


def test_a_block_failed_through_the_api_reaches_an_open_event_stream(console_stack: ConsoleStack):
    job = _job("live")
    with console_stack.cell() as cell:
        cell.submit(job, (4, 4, 4), node_type="tpu")
        pod_id = cell.get(job).pod_id
        view_blocks = cell.pod(pod_id, include_view=True).view.blocks
        free = next(b.block_id for b in view_blocks if not b.job_id and b.health != 2)
        with console_stack.http() as client:
            stream = _events(client, f"/events/pod?id={pod_id}")
            event, first = next(stream)
            assert event == "view"
            assert next(b for b in first["blocks"] if b["block_id"] == free)["health"] != "FAILED"
            cell.report_block_health(pod_id, free, failed=True, reason="console test")
            for _event, data in stream:
                block = next(b for b in data["blocks"] if b["block_id"] == free)
                if block["health"] == "FAILED":
                    break
            else:
                pytest.fail("the stream ended before the failed block showed")
        cell.report_block_health(pod_id, free, failed=False, reason="console test")


def test_the_other_views_answer_from_the_services(console_stack: ConsoleStack):
    with console_stack.http() as client:
        ocs = client.get("/api/view/ocs", params={"pod": "pod-2"}).json()
        assert ocs["switches"] and all(0 <= s["use"] <= 1 for s in ocs["switches"])
        cores = client.get("/api/view/cores").json()
        devices = {d["device_id"]: d for d in cores["devices"]}
        edge0 = devices["edge-0"]
        assert {b["reservation_id"] for b in edge0["bars"]} == {"r-now", "r-later"}
        assert edge0["free"][0][1] == 10  # 6 of 16 cores reserved from now
        # the timeline ends at the last reservation's end, a whole tick later at most (the
        # issue: a fixed 6-hour axis turned minutes-long reservations into slivers)
        rows = {r["reservation_id"]: r for r in cores["reservations"]}
        assert set(rows) == {"r-now", "r-later", "r-other"}
        last = max(r["end"] for r in rows.values())
        assert last <= cores["end"] < last + cores["tick"] and cores["tick"] <= 600
        assert rows["r-later"]["devices"] == [{"device_id": "edge-0", "cores": 10}]
        assert rows["r-now"]["state"] == "ACTIVE" and rows["r-later"]["state"] == "SCHEDULED"
        agg = client.get("/api/view/agg").json()
        assert {n["id"] for n in agg["nodes"]} >= {"root", "sub-1", "sub-2"}
        assert set(agg["switches"]) == {"root", "sub-1", "sub-2"}


def test_sign_in_required_when_anonymous_reads_are_off(console_stack: ConsoleStack, tmp_path):
    """A second console on the same services with LIGHTPATH_CONSOLE_ANONYMOUS=none: a viewer
    who has not signed in gets nothing but the sign-in page."""
    stack = console_stack.stack
    files = stack.ca.paths(console_principal())
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_")},
        **console_env(stack.specs, port),
        "LIGHTPATH_TLS_CERT": str(files.cert),
        "LIGHTPATH_TLS_KEY": str(files.key),
        "LIGHTPATH_TLS_CA": str(files.ca),
        "LIGHTPATH_CONSOLE_ANONYMOUS": "none",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "lightpath_services.console"], env=env, stderr=subprocess.PIPE
    )
    try:
        url = f"https://127.0.0.1:{port}/"
        deadline = time.monotonic() + 60
        while console_health(url, console_stack.ca, 0.5) != "SERVING":
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the second console did not come up"
            time.sleep(0.2)
        with httpx.Client(base_url=url, verify=console_stack.tls(), timeout=15) as client:
            assert client.get("/api/session").json()["anonymous_reads"] is False
            resp = client.get("/api/view/cell")
            assert resp.status_code == 401
            assert resp.json()["error"]["reason"] == "SIGN_IN_REQUIRED"
            assert client.get("/").status_code == 200  # the page with its sign-in form
            client.post(
                "/api/login",
                json={"token": console_stack.tokens["globex"]},
                headers={"Origin": url.rstrip("/")},
            ).raise_for_status()
            jobs = client.get("/api/view/cell").json()["jobs"]
            assert {j["tenant"] for j in jobs} <= {"globex"}
    finally:
        proc.terminate()
        proc.wait(15)


def test_a_console_without_a_certificate_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTPATH_")}
    out = subprocess.run(
        [sys.executable, "-m", "lightpath_services.console"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "LIGHTPATH_TLS_CERT" in out.stderr and "HTTPS" in out.stderr
