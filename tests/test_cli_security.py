"""The CLI side of security, as a person and a script use it: identities per command
(`--as`, tokens), tenant and token commands on the local stack, the audit log, and
errors that say what to do next.

Most tests run the real CLI in-process (`lightpath.cli.main`) against one real local
stack (`lightpath.stack.Stack`: its own CA, Redis with a password, one process of
each service on free ports) shared by the module; the audit reader's own tests need
no stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightpath.cli import main
from lightpath.security.identity import Principal
from lightpath.security.pki import LocalCA
from lightpath.stack import Stack, default_topology, with_ephemeral_ports

# One stack for the module: its tests share a worker (else each worker starts its own).
pytestmark = pytest.mark.xdist_group("cli-security")

# What the test session puts in the environment (tests/conftest.py: the test CA's
# operator) and what a user's shell might hold: none of it applies to the local stack.
_FOREIGN_ENV = (
    "LIGHTPATH_REDIS_URL",
    "LIGHTPATH_TLS_CA",
    "LIGHTPATH_TLS_CERT",
    "LIGHTPATH_TLS_KEY",
    "LIGHTPATH_TOKEN",
    "LIGHTPATH_TOKEN_FILE",
    "LIGHTPATH_IDENTITY",
    "LIGHTPATH_PLAINTEXT",
    "LIGHTPATH_CELL_ADDR",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# -- against a running local stack -------------------------------------------------

# One process of each service (as in test_stack_metrics.py): these commands reach the cell
# and a pod behind it. The default topology's two more pods and two more switches (six
# processes, ~9 CPU-s of this module's 22) are used by no test here.
ONE_OF_EACH = ("cell-scheduler", "ocs-pod-1", "ws-pod-1", "core-broker", "agg-root")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("stack")
    with pytest.MonkeyPatch.context() as mp:
        for key in _FOREIGN_ENV:
            mp.delenv(key, raising=False)
        mp.setenv("LIGHTPATH_STATE_DIR", str(state_dir))
        st = Stack(
            state_dir,
            specs=[s for s in with_ephemeral_ports(default_topology()) if s.name in ONE_OF_EACH],
            redis_port=0,
            log=lambda *a: None,
        )
        st.start()
        try:
            _wait_for_pods(st)
            yield st
        finally:
            st.stop()


def _wait_for_pods(st: Stack, timeout: float = 60.0) -> None:
    """Until every superpod of the topology has registered with the cell and reported."""
    from lightpath.client import channel
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import cell_scheduler_pb2_grpc

    wanted = {s.env["LIGHTPATH_POD_ID"] for s in st.specs if s.service == "workload_scheduler"}

    async def wait() -> None:
        async with channel(st.endpoints["cell-scheduler"], credentials=st.operator) as ch:
            cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                pods = (await cell.ListPods(cs.ListPodsRequest())).pods
                ready = {
                    p.registration.pod_id
                    for p in pods
                    if p.status == cs.POD_STATUS_READY and p.capacity.types
                }
                if wanted <= ready:
                    return
                assert asyncio.get_running_loop().time() < deadline, f"pods ready: {ready}"
                await asyncio.sleep(0.1)

    asyncio.run(wait())


@pytest.fixture
def on_stack(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """A test's environment: the stack's state dir, nothing else (what a test sets is undone)."""
    for key in _FOREIGN_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(stack.state_dir))
    return stack


slow = pytest.mark.slow  # starts a whole stack (once for the module)


def _submit(capsys, job_id: str, *global_args: str) -> dict:
    return run_json(capsys, *global_args, "submit", job_id, "--shape", "4x4x4")


@slow
def test_tenant_create_then_submit_as_the_tenant(on_stack, capsys):
    code, out, err = run(capsys, "tenant", "create", "acme")
    assert code == 0, err
    assert "lightpath --as acme" in out
    files = on_stack.ca.paths(Principal("tenant", "acme"))
    assert files.cert.exists() and (files.key.stat().st_mode & 0o777) == 0o600

    resp = _submit(capsys, "acme-1", "--as", "acme")
    assert resp["job"]["tenant"] == "acme"
    # --as after the command, and `tenant:acme` spelled out, are the same identity
    code, out, err = run(capsys, "job", "acme-1", "--as", "tenant:acme", "--json")
    assert code == 0, err
    assert json.loads(out)["tenant"] == "acme"

    # a second `tenant create` keeps the valid certificate
    code, out, _ = run(capsys, "tenant", "create", "acme")
    assert code == 0 and "already has a valid certificate" in out


@slow
def test_a_tenant_sees_and_touches_only_its_own_jobs(on_stack, capsys):
    assert run(capsys, "tenant", "create", "acme")[0] == 0
    _submit(capsys, "acme-2", "--as", "acme")
    other = run_json(
        capsys, "submit", "other-1", "--shape", "4x4x4", "--tenant", "other"
    )  # the operator, for tenant other
    assert other["job"]["tenant"] == "other"

    code, _, err = run(capsys, "--as", "acme", "cancel", "other-1")
    assert code == 1
    assert "NOT_FOUND" in err and "other-1" in err
    assert "next: as tenant:acme you see only what belongs to tenant acme" in err
    assert "Traceback" not in err

    jobs = run_json(capsys, "--as", "acme", "jobs")["jobs"]
    assert {j["tenant"] for j in jobs} == {"acme"}
    assert "acme-2" in {j["job_id"] for j in jobs}
    everyone = run_json(capsys, "jobs")["jobs"]  # the operator, by default
    assert {"acme", "other"} <= {j["tenant"] for j in everyone}

    # a tenant naming another tenant is refused, and told what to do
    code, _, err = run(capsys, "--as", "acme", "jobs", "--tenant", "other")
    assert code == 1 and "PERMISSION_DENIED" in err
    assert "next: a tenant's credential acts only for its own tenant" in err

    # the operator may cancel anyone's job
    code, _, err = run(capsys, "cancel", "other-1")
    assert code == 0, err


@slow
def test_a_tenant_may_not_call_operator_methods(on_stack, capsys):
    assert run(capsys, "tenant", "create", "acme")[0] == 0
    code, out, err = run(capsys, "--as", "acme", "pods")
    assert code == 1 and out == ""
    assert "PERMISSION_DENIED" in err
    assert "tenant:acme may not call ListPods: it needs the role operator" in err
    assert "--as operator" in err
    assert run(capsys, "--as", "operator", "pods")[0] == 0


@slow
def test_an_identity_without_a_credential_says_how_to_get_one(on_stack, capsys):
    code, out, err = run(capsys, "--as", "nobody", "jobs")
    assert code == 2 and out == ""
    assert "no local credential for tenant:nobody" in err
    assert "run `lightpath tenant create nobody`" in err
    assert "Traceback" not in err

    code, _, err = run(capsys, "--as", "bad name!", "jobs")
    assert code == 2 and "--as bad name!" in err and "1-64 characters" in err


@slow
def test_whoami_names_what_a_command_presents(on_stack, capsys):
    me = run_json(capsys, "whoami")
    assert me["certificate_principal"] == "operator:operator" and me["tls"]
    assert run(capsys, "tenant", "create", "acme")[0] == 0
    assert run_json(capsys, "--as", "acme", "whoami")["certificate_principal"] == "tenant:acme"


@slow
def test_a_token_names_the_caller_where_it_is_accepted(on_stack, capsys, monkeypatch):
    made = run_json(capsys, "token", "create", "tenant:beta")
    assert made["principal"] == "tenant:beta" and made["token"].startswith("lpt1.")
    listed = run_json(capsys, "token", "list", "--principal", "beta")
    assert [t["token_id"] for t in listed] == [made["token_id"]]
    assert "token" not in listed[0]  # never the secret
    code, out, _ = run(capsys, "token", "list", "--principal", "beta", "-o", "name")
    assert code == 0 and out.split() == [made["token_id"]]
    code, out, _ = run(capsys, "token", "list", "--principal", "beta", "--no-headers")
    assert out.split()[:2] == [made["token_id"], "tenant:beta"]

    # the CLI still presents the operator's certificate; the token names the principal
    monkeypatch.setenv("LIGHTPATH_TOKEN", made["token"])
    assert _submit(capsys, "beta-1")["job"]["tenant"] == "beta"
    me = run_json(capsys, "whoami")
    assert me["token_id"] == made["token_id"] and me["principal"] == "tenant:beta"
    assert me["certificate_principal"] == "operator:operator"
    code, _, err = run(capsys, "pods")
    assert code == 1 and "tenant:beta may not call ListPods" in err

    # `--as` sets the token aside for the command
    assert run(capsys, "--as", "operator", "pods")[0] == 0

    monkeypatch.delenv("LIGHTPATH_TOKEN")
    code, out, err = run(capsys, "token", "revoke", made["token_id"])
    assert code == 0 and "revoked" in out, err
    monkeypatch.setenv("LIGHTPATH_TOKEN", made["token"])
    deadline = time.monotonic() + 15
    while True:  # services trust a verified token for a couple of seconds
        code, _, err = run(capsys, "jobs")
        if code == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert code == 1 and "UNAUTHENTICATED" in err
    assert "the bearer token from LIGHTPATH_TOKEN is unknown or revoked" in err
    monkeypatch.delenv("LIGHTPATH_TOKEN")
    code, _, err = run(capsys, "token", "revoke", made["token_id"])
    assert code == 1 and "no token" in err


@slow
def test_tenant_create_with_a_token(on_stack, capsys):
    made = run_json(capsys, "tenant", "create", "gamma", "--token")
    path = Path(made["token_file"])
    assert path.read_text().strip() == made["token"]
    assert (path.stat().st_mode & 0o777) == 0o600
    listed = run_json(capsys, "tenant", "list")
    assert listed["tokens_known"]
    gamma = next(t for t in listed["tenants"] if t["tenant"] == "gamma")
    assert "gamma" in run(capsys, "tenant", "list", "-o", "name")[1].split()
    assert gamma["certificate"] and gamma["tokens"][0]["token_id"] == made["token_id"]

    again = run_json(capsys, "tenant", "create", "gamma", "--token")
    assert again["previous_token_id"] == made["token_id"]
    assert again["token_id"] != made["token_id"]
    for token_id in (made["token_id"], again["token_id"]):
        assert run(capsys, "token", "revoke", token_id)[0] == 0


@slow
def test_audit_shows_who_did_what(on_stack, capsys):
    assert run(capsys, "tenant", "create", "audited")[0] == 0
    _submit(capsys, "audited-1", "--as", "audited")
    assert run(capsys, "--as", "audited", "pods")[0] == 1

    # A refused call's audit line is written as the call ends on the server, which may
    # be just after the caller has its answer: read until it is there.
    deadline = time.monotonic() + 15
    while True:
        entries = run_json(capsys, "audit", "--principal", "tenant:audited")
        if any(e["method"].endswith("/ListPods") for e in entries):
            break
        if time.monotonic() > deadline:
            break  # the assertions below say what is missing
        time.sleep(0.1)
    submits = [e for e in entries if e["method"].endswith("CellScheduler/SubmitJob")]
    assert submits and submits[0]["code"] == "OK"
    assert submits[0]["resources"]["spec.job_id"] == "audited-1"
    assert {"ts", "service", "instance", "principal", "trace_id", "level"} <= set(submits[0])
    denied = [e for e in entries if e["method"].endswith("/ListPods")]
    assert denied and denied[0]["code"] == "PERMISSION_DENIED"
    assert "needs the role operator" in denied[0]["message"]
    assert entries == sorted(entries, key=lambda e: e["ts"])
    code, out, _ = run(capsys, "audit", "--principal", "audited", "-o", "yaml", "--denied")
    assert code == 0 and "code: PERMISSION_DENIED" in out
    code, out, _ = run(capsys, "audit", "--principal", "audited", "--no-headers")
    assert code == 0 and not out.startswith("time") and "SubmitJob" in out
    # a tenant's bare name is the same principal
    assert run_json(capsys, "audit", "--principal", "audited") == entries

    only_denied = run_json(capsys, "audit", "--principal", "audited", "--denied")
    assert [e["method"] for e in only_denied] == [denied[0]["method"]]
    by_method = run_json(capsys, "audit", "--method", "submitjob", "--principal", "audited")
    assert by_method and all(e["method"].endswith("/SubmitJob") for e in by_method)
    patterned = run_json(
        capsys, "audit", "--method", "CellScheduler/*Job", "--principal", "audited"
    )
    assert patterned == by_method

    # time: relative and ISO
    assert run_json(capsys, "audit", "--principal", "audited", "--since", "1h") == entries
    assert run_json(capsys, "audit", "--principal", "audited", "--until", "1h") == []
    first = entries[0]["ts"]
    assert run_json(capsys, "audit", "--principal", "audited", "--since", first) == entries
    assert run_json(capsys, "audit", "--principal", "audited", "--until", first) == entries[:1]

    # the CLI's own issuing is in the log too
    created = run_json(capsys, "audit", "--method", "CreateTenant")
    assert any(e["resources"].get("tenant") == "audited" for e in created)

    code, out, _ = run(capsys, "audit", "--principal", "audited")
    assert code == 0
    header, *_ = out.splitlines()
    assert header.split()[:6] == ["time", "process", "principal", "method", "resources", "code"]
    assert "SubmitJob" in out and "spec.job_id=audited-1" in out and "PERMISSION_DENIED" in out


@slow
def test_tls_failures_say_what_to_do(on_stack, capsys, monkeypatch):
    # no TLS against a TLS service
    monkeypatch.setenv("LIGHTPATH_PLAINTEXT", "true")
    code, _, err = run(capsys, "jobs")
    assert code == 1 and "UNAVAILABLE" in err
    assert "requires TLS with a client certificate, and this command presents none" in err
    assert "next: unset LIGHTPATH_PLAINTEXT" in err
    monkeypatch.delenv("LIGHTPATH_PLAINTEXT")

    # your own PKI, but not this cell's: the service does not trust your certificate...
    other = LocalCA(on_stack.state_dir.parent / "other-pki").ensure()
    files = other.issue(Principal("operator", "operator"))
    monkeypatch.setenv("LIGHTPATH_TLS_CA", str(on_stack.ca.cert_path))
    monkeypatch.setenv("LIGHTPATH_TLS_CERT", str(files.cert))
    monkeypatch.setenv("LIGHTPATH_TLS_KEY", str(files.key))
    code, _, err = run(capsys, "jobs")
    assert code == 1 and "UNAVAILABLE" in err
    assert "closed the connection in the TLS handshake" in err
    assert (
        f"this command's certificate (the certificate in LIGHTPATH_TLS_CERT ({files.cert}))" in err
    )

    # ... and you do not trust the service's
    monkeypatch.setenv("LIGHTPATH_TLS_CA", str(files.ca))
    code, _, err = run(capsys, "jobs")
    assert code == 1 and "UNAVAILABLE" in err
    assert "the TLS handshake failed: this command does not trust the service's certificate" in err

    # no certificate at all: your own CA to trust, but no certificate of yours
    monkeypatch.delenv("LIGHTPATH_TLS_CERT")
    monkeypatch.delenv("LIGHTPATH_TLS_KEY")
    monkeypatch.setenv("LIGHTPATH_TLS_CA", str(on_stack.ca.cert_path))
    code, _, err = run(capsys, "jobs")
    assert code == 1 and "LIGHTPATH_TLS_CA is set but LIGHTPATH_TLS_CERT is not" in err


# -- without a stack ------------------------------------------------------------------


@pytest.fixture
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in _FOREIGN_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def accepts_and_closes() -> Iterator[str]:
    """What a published port of a starting container looks like from the host: the
    engine's port forwarder accepts each connection and closes it (nothing behind it)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    server.close()


def test_a_cell_that_is_not_serving_yet_is_not_called_a_certificate_problem(
    no_stack, capsys, monkeypatch, accepts_and_closes
):
    from tests.helpers import tls_env

    for key, value in tls_env(Principal("operator", "operator")).items():
        monkeypatch.setenv(key, value)
    code, _, err = run(capsys, "jobs", "--cell", accepts_and_closes)
    assert code == 1 and "UNAVAILABLE" in err
    assert (
        f"the cell is not serving yet: something accepts connections at {accepts_and_closes}" in err
    )
    assert "another CA" not in err


@pytest.mark.parametrize(
    "grpc_words",
    [
        "Socket closed",
        # the same hang-up when it races the first handshake read (seen on a loaded machine)
        "Handshake read failed",
    ],
)
def test_either_wording_of_a_hang_up_before_tls_is_called_not_serving(
    accepts_and_closes, grpc_words
):
    from lightpath.cli._common import _unavailable_steps
    from lightpath.errors import LightpathError
    from lightpath.security.credentials import Credentials
    from tests.helpers import tls_env

    exc = LightpathError("unavailable")
    exc.address, exc.process = accepts_and_closes, "cell-scheduler"
    creds = Credentials.default(environ=tls_env(Principal("operator", "operator")))
    assert creds.cert
    message = (
        "failed to connect to all addresses; last error: UNAVAILABLE: "
        f"ipv4:{accepts_and_closes}: {grpc_words}"
    )
    steps = _unavailable_steps(message, creds, exc)
    assert steps[0].startswith(
        f"the cell is not serving yet: something accepts connections at {accepts_and_closes}"
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["tenant", "create", "acme"], "no local CA in"),
        (["token", "create", "tenant:acme"], "no stack running from"),
        (["token", "list"], "no stack running from"),
        (["token", "revoke", "abc"], "no stack running from"),
        (["audit"], "no audit log in"),
    ],
)
def test_without_a_stack_the_commands_say_to_start_one(no_stack, capsys, argv, says):
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert says in err and "lightpath up" in err
    assert "Traceback" not in err
    assert not (no_stack / "pki").exists()  # nothing made on the side


def test_tenant_create_refuses_a_bad_name(no_stack, capsys):
    LocalCA(no_stack / "pki").ensure()
    code, _, err = run(capsys, "tenant", "create", "no/such/tenant")
    assert code == 2 and "1-64 characters" in err


def _entry(ts: str, method: str, principal: str, code: str = "OK", **more) -> dict:
    return {
        "ts": ts,
        "service": "cell_scheduler",
        "instance": "cell-scheduler",
        "method": f"/lightpath.v1.CellScheduler/{method}",
        "principal": principal,
        "resources": {"job_id": "j"},
        "code": code,
        "trace_id": "t",
        "level": "Metadata",
        **more,
    }


@pytest.fixture
def audit_files(no_stack: Path) -> list[dict]:
    """Two processes' logs of a stopped stack, interleaved in time, one line cut short."""
    a = [
        _entry("2020-01-01T10:00:00.000Z", "SubmitJob", "tenant:acme"),
        _entry("2020-01-01T10:00:02.000Z", "CancelJob", "tenant:acme", "NOT_FOUND"),
        _entry(
            "2020-01-01T10:00:04.000Z",
            "ListPods",
            "tenant:acme",
            "PERMISSION_DENIED",
            message="tenant:acme may not call ListPods: it needs the role operator",
        ),
    ]
    b = [
        _entry("2020-01-01T10:00:01.000Z", "SubmitJob", "operator:operator"),
        _entry("2020-01-01T10:00:03.000Z", "ReportBlockHealth", "operator:operator"),
        _entry("2020-01-01T10:00:05.000Z", "SubmitJob", "", "UNAUTHENTICATED"),
    ]
    audit = no_stack / "audit"
    audit.mkdir()
    (audit / "cell-scheduler.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in a) + '{"ts": "2020-01-01T10:00:0'
    )
    (audit / "ws-pod-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in b))
    return sorted(a + b, key=lambda e: e["ts"])


def test_audit_merges_a_stopped_stacks_logs_by_time(audit_files, capsys):
    code, out, err = run(capsys, "audit", "--json")
    assert code == 0
    assert json.loads(out) == audit_files
    assert "1 line(s) of the audit log are not entries" in err


def test_audit_filters(audit_files, capsys):
    def ts(*argv: str) -> list[str]:
        return [e["ts"][11:19] for e in run_json(capsys, "audit", *argv)]

    assert ts("--principal", "acme") == ["10:00:00", "10:00:02", "10:00:04"]
    assert ts("--principal", "operator") == ["10:00:01", "10:00:03"]
    assert ts("--principal", "tenant:*", "--principal", "operator") == ts()[:5]
    assert ts("--method", "SubmitJob") == ["10:00:00", "10:00:01", "10:00:05"]
    assert ts("--method", "submit", "--principal", "acme") == ["10:00:00"]
    assert ts("--denied") == ["10:00:04", "10:00:05"]
    assert ts("--code", "not_found") == ["10:00:02"]
    assert ts("--since", "2020-01-01T10:00:02Z", "--until", "2020-01-01T10:00:03Z") == [
        "10:00:02",
        "10:00:03",
    ]
    assert ts("--since", "2020-01-01T11:00:02+01:00") == [
        "10:00:02",
        "10:00:03",
        "10:00:04",
        "10:00:05",
    ]
    assert ts("--since", "1h") == []  # long ago
    assert ts("--until", "1h") == ts()
    assert ts("--limit", "2") == ["10:00:04", "10:00:05"]
    assert ts("--service", "ws-pod-1") == []  # instance names what the entry says
    assert ts("--service", "cell_scheduler")[:1] == ["10:00:00"]

    code, _, err = run(capsys, "audit", "--since", "yesterday-ish")
    assert code == 2 and "is not a time" in err


def test_audit_table_for_people(audit_files, capsys):
    code, out, err = run(capsys, "audit", "--limit", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "time",
        "process",
        "principal",
        "method",
        "resources",
        "code",
        "message",
    ]
    assert len(lines) == 2 + 3
    assert "PERMISSION_DENIED" in lines[-2] and "needs the role operator" in lines[-2]
    assert "the last 3 of 6 matching entries; --limit 0 shows all" in err

    code, out, _ = run(capsys, "audit", "--principal", "nobody-at-all")
    assert code == 0 and "no audit entries match (6 read from 2 file(s))" in out


def test_audit_reads_given_files(audit_files, no_stack, capsys):
    path = no_stack / "audit" / "ws-pod-1.jsonl"
    assert len(run_json(capsys, "audit", "--file", str(path))) == 3
    code, _, err = run(capsys, "audit", "--file", str(no_stack / "nope.jsonl"))
    assert code == 1 and "no audit file" in err


def test_as_leaves_the_environment_as_it_was(no_stack, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_TOKEN", "lpt1.x.y")
    LocalCA(no_stack / "pki").ensure()
    code, _, err = run(capsys, "--as", "acme", "whoami")
    assert code == 2 and "lightpath tenant create acme" in err
    assert os.environ["LIGHTPATH_TOKEN"] == "lpt1.x.y"
    assert "LIGHTPATH_IDENTITY" not in os.environ
