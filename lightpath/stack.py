"""The local stack (X-7): Redis plus every service of a small default topology on
loopback, as child processes of one supervisor.

The topology below is the single source of truth for `lightpath up`, the demo,
and deploy/docker-compose.yml (a test checks the compose file against it):

    cell-scheduler                  :50051
    ws-pod-1 / ocs-pod-1            :50061 / :50062   superpod pod-1
    (switches-pod-1)                :50063            its switches, with switch agents
    ws-pod-2 / ocs-pod-2            :50071 / :50072   superpod pod-2
    (switches-pod-2)                :50073
    ws-pod-3 / ocs-pod-3            :50065 / :50066   superpod pod-3 (SWITCHED, seed 002)
    core-broker                     :50081
    agg-root / agg-sub-1 / agg-sub-2 :50091 / :50092 / :50093
    console (web, HTTPS; `lightpath up` only) :8443

The console (services/lightpath_services/console, issue 21) is not a gRPC service and not part of the
topology list: `console_env` gives its settings from the topology, and a Stack starts it
when given a `console_port` (as `lightpath up` does), after every service is healthy.

Security (docs/security.md): on first use the stack makes a local CA and a
certificate per process and for the operator under `<state dir>/pki`, and a
Redis password under `<state dir>/secrets`; every service serves TLS and
requires client certificates, binds 127.0.0.1, and writes its audit log to
`<state dir>/audit/<process>.jsonl`. `tls=False` (benchmarks' baseline) runs
plaintext on loopback with a bearer token per process instead.

Metrics: every process serves Prometheus metrics on 127.0.0.1:<gRPC port + 1000>
(`ProcessSpec.metrics_port`, LIGHTPATH_METRICS_LISTEN; deploy/monitoring). `lightpath
status` lists the URLs. A process's stdout (console OTel exporters, one JSON object a
line) goes to `logs/<process>.otel.jsonl`, apart from its JSON-lines log on stderr
(`logs/<process>.log`).

Children run in their own session (Ctrl-C reaches only the supervisor, which
stops them in reverse order) and get SIGTERM from the kernel if the supervisor
dies, so no process is left behind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath import __version__
from lightpath.embedded_redis import EmbeddedRedis, dies_with_parent, free_port
from lightpath.paths import default_state_dir, open_private_append, pki_dir, write_private
from lightpath.security.credentials import Credentials, token_path
from lightpath.security.identity import (
    OPERATOR,
    Principal,
    console_principal,
    service_principal,
)
from lightpath.v1 import agg_switch_pb2, agg_switch_pb2_grpc

EMBEDDED_REDIS_PORT = 6390
METRICS_PORT_OFFSET = 1000  # a process's metrics port in the default topology: gRPC port + this
CONSOLE_PORT = 8443  # the web console's HTTPS port under `lightpath up`
CONSOLE_NAME = "console"
# The web console's Prometheus endpoint under `lightpath up` (its HTTPS port + 1000).
CONSOLE_METRICS_PORT = CONSOLE_PORT + METRICS_PORT_OFFSET
# The alert rules, beside the scrape configs in a source checkout (not in a wheel).
ALERT_RULES = Path(__file__).resolve().parent.parent / "deploy" / "monitoring" / "alerts.yml"


@dataclass(frozen=True)
class ProcessSpec:
    """One service process of the stack."""

    name: str  # process / compose service name, e.g. "ocs-pod-1"
    service: str  # subpackage of lightpath_services, e.g. "ocs_manager"
    port: int
    env: Mapping[str, str] = field(default_factory=dict)  # service-specific settings
    peers: Mapping[str, str] = field(
        default_factory=dict
    )  # env var -> name of the process it points at
    metrics_port: int = 0  # Prometheus scrape endpoint on loopback; 0: none
    # Where it listens and is reached, and the network namespace it runs in ("": this
    # one): bench/partitions.py puts a pod behind a link it can cut (lightpath.testing.netns).
    host: str = "127.0.0.1"
    netns: str = ""

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else ""

    @property
    def console_script(self) -> str:
        return "lightpath-" + self.service.replace("_", "-")

    @property
    def principal(self) -> Principal:
        """Its identity: the service, scoped by the pod or switch it serves."""
        scope = self.env.get("LIGHTPATH_POD_ID") or self.env.get("LIGHTPATH_SWITCH_ID") or ""
        return service_principal(self.service, scope)


AGENT_SETTLE_MS = "10"  # the stack's simulated MEMS settling time with switch agents


def default_topology(*, switch_agents: bool = False) -> list[ProcessSpec]:
    """Start order: a process comes after every process it points at, except
    the workload schedulers' cell registration, which retries until the cell answers.

    `switch_agents`: the OCS pods' switches run as a switch_agent process per pod
    (the open southbound, docs/ocs_southbound.md) which the pod's ocs_manager
    programs, instead of the ocs_manager's simulation in Redis (faster: the demo's
    default). Compose and Kubernetes run with them (`deployed_topology`)."""
    specs = [ProcessSpec("cell-scheduler", "cell_scheduler", 50051)]
    # pod-1: one OCS per logical axis (seed Fig. 8/9); pod-2: two, behind 1x2 switches (Fig. 12),
    # and mixed node types like seed ¶47 (60 tpu blocks + 4 gpu blocks).
    for pod, base, k, types in (("pod-1", 50061, 1, "tpu"), ("pod-2", 50071, 2, "tpu:60,gpu")):
        fabric = {
            "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
            "LIGHTPATH_FABRIC_BLOCKS": "64",
            "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
            "LIGHTPATH_FABRIC_OCS_RADIX": "136",
        }
        peers = {}
        if switch_agents:
            specs.append(
                ProcessSpec(
                    f"switches-{pod}",
                    "switch_agent",
                    base + 2,
                    env={
                        "LIGHTPATH_POD_ID": pod,
                        **fabric,
                        "LIGHTPATH_AGENT_SETTLE_MS": AGENT_SETTLE_MS,
                    },
                )
            )
            peers = {"LIGHTPATH_OCS_SWITCH_AGENTS": f"switches-{pod}"}
        specs.append(
            ProcessSpec(
                f"ocs-{pod}",
                "ocs_manager",
                base + 1,
                env={"LIGHTPATH_POD_ID": pod, **fabric},
                peers=peers,
            )
        )
        specs.append(
            ProcessSpec(
                f"ws-{pod}",
                "workload_scheduler",
                base,
                env={"LIGHTPATH_POD_ID": pod, "LIGHTPATH_BLOCK_TYPES": types},
                peers={
                    "LIGHTPATH_OCS_ADDR": f"ocs-{pod}",
                    "LIGHTPATH_CELL_ADDR": "cell-scheduler",
                    "LIGHTPATH_ADVERTISE_ADDR": f"ws-{pod}",
                },
            )
        )
    # pod-3: SWITCHED (seed 002): 2x4 groups of 3x3 processors on two-tier switches,
    # the last two groups reserved for small jobs.
    specs.append(
        ProcessSpec(
            "ocs-pod-3",
            "ocs_manager",
            50066,
            env={
                "LIGHTPATH_POD_ID": "pod-3",
                "LIGHTPATH_FABRIC_KIND": "SWITCHED",
                "LIGHTPATH_SWITCHED_FABRIC": "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64",
            },
        )
    )
    specs.append(
        ProcessSpec(
            "ws-pod-3",
            "workload_scheduler",
            50065,
            env={
                "LIGHTPATH_POD_ID": "pod-3",
                "LIGHTPATH_BLOCK_TYPES": "npu",
                "LIGHTPATH_SWITCHED_SMALL_GROUPS": "2",
            },
            peers={
                "LIGHTPATH_OCS_ADDR": "ocs-pod-3",
                "LIGHTPATH_CELL_ADDR": "cell-scheduler",
                "LIGHTPATH_ADVERTISE_ADDR": "ws-pod-3",
            },
        )
    )
    specs.append(
        ProcessSpec(
            "core-broker",
            "core_broker",
            50081,
            env={
                # wide enough that the demo's concurrent requests share a batch (CB-5)
                "LIGHTPATH_CB_BATCH_WINDOW_MS": "20",
            },
        )
    )
    for switch, port in (("root", 50091), ("sub-1", 50092), ("sub-2", 50093)):
        specs.append(
            ProcessSpec(
                f"agg-{switch}",
                "agg_switch",
                port,
                env={"LIGHTPATH_SWITCH_ID": switch, "LIGHTPATH_AGG_TREE": "tree-1"},
                peers={"LIGHTPATH_ADVERTISE_ADDR": f"agg-{switch}"},
            )
        )
    return [replace(s, metrics_port=s.port + METRICS_PORT_OFFSET) for s in specs]


# The local stack's aggregation tree (seed 003's two-switch cluster): the root over sub-1
# (compute nodes n1, n2, n3) and sub-2 (n4, n5). `lightpath up` defines it when its tree has
# none, so `lightpath agg topology` answers on a fresh stack and `agg start` / `agg
# contribute` have compute nodes to name; the demo and docs/agg_switch.md use it too.
AGG_TREE = "tree-1"
AGG_TREE_NODES = {"sub-1": ("n1", "n2", "n3"), "sub-2": ("n4", "n5")}
AGG_THRESHOLDS_MS = {"root": 600, "sub-1": 200, "sub-2": 200}


def default_agg_topology() -> agg_switch_pb2.AggTopology:
    sw, cn = agg_switch_pb2.AGG_NODE_KIND_SWITCH, agg_switch_pb2.AGG_NODE_KIND_COMPUTE
    nodes = [agg_switch_pb2.AggNode(id="root", kind=sw, threshold_ms=AGG_THRESHOLDS_MS["root"])]
    for switch, computes in AGG_TREE_NODES.items():
        nodes.append(
            agg_switch_pb2.AggNode(
                id=switch, kind=sw, parent="root", threshold_ms=AGG_THRESHOLDS_MS[switch]
            )
        )
        nodes += [agg_switch_pb2.AggNode(id=n, kind=cn, parent=switch) for n in computes]
    return agg_switch_pb2.AggTopology(tree_id=AGG_TREE, nodes=nodes)


async def define_default_agg_tree(
    address: str, credentials: Credentials, expect: Principal | None = None
) -> bool:
    """Define `default_agg_topology` through the switch at `address` unless its tree has a
    topology already (one an operator defined is kept). True when it defined it."""
    from lightpath.client import channel

    async with channel(address, credentials=credentials, expect=expect) as ch:
        stub = agg_switch_pb2_grpc.AggSwitchStub(ch)
        try:
            await stub.GetTopology(agg_switch_pb2.GetTopologyRequest(tree_id=AGG_TREE))
            return False
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
        topology = default_agg_topology()
        await stub.DefineTopology(agg_switch_pb2.DefineTopologyRequest(topology=topology))
        return True


def deployed_topology() -> list[ProcessSpec]:
    """What deploy/ (compose, Kubernetes) runs: the local stack with switch agents."""
    return default_topology(switch_agents=True)


def with_ephemeral_ports(specs: list[ProcessSpec]) -> list[ProcessSpec]:
    return [
        ProcessSpec(
            s.name, s.service, free_port(), s.env, s.peers, free_port() if s.metrics_port else 0
        )
        for s in specs
    ]


def process_env(
    spec: ProcessSpec, specs: list[ProcessSpec], redis_url: str, host: str = "127.0.0.1"
) -> dict[str, str]:
    """The LIGHTPATH_* variables one process gets (host: how peers are reached)."""
    by_name = {s.name: s for s in specs}
    bind = "0.0.0.0" if host == "compose" else spec.host
    env = {"LIGHTPATH_REDIS_URL": redis_url, "LIGHTPATH_LISTEN": f"{bind}:{spec.port}", **spec.env}
    for var, name in spec.peers.items():
        peer = by_name[name]
        at = name if host == "compose" else host if peer.host == "127.0.0.1" else peer.host
        env[var] = f"{at}:{peer.port}"
    return env


def console_env(specs: list[ProcessSpec], port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """The console's settings for this topology: where it listens and where every service it
    shows is (host "compose": by service name, listening on every interface)."""

    def at(spec: ProcessSpec) -> str:
        return f"{spec.name if host == 'compose' else host}:{spec.port}"

    by_service: dict[str, list[ProcessSpec]] = {}
    for s in specs:
        by_service.setdefault(s.service, []).append(s)
    bind = "0.0.0.0" if host == "compose" else "127.0.0.1"
    env = {
        "LIGHTPATH_CONSOLE_LISTEN": f"{bind}:{port}",
        "LIGHTPATH_CELL_ADDR": at(by_service["cell_scheduler"][0]),
        "LIGHTPATH_CONSOLE_OCS_ADDRS": ",".join(
            f"{s.env['LIGHTPATH_POD_ID']}={at(s)}" for s in by_service.get("ocs_manager", [])
        ),
        "LIGHTPATH_CONSOLE_AGG_ADDRS": ",".join(
            f"{s.env['LIGHTPATH_SWITCH_ID']}={at(s)}" for s in by_service.get("agg_switch", [])
        ),
    }
    if by_service.get("core_broker"):
        env["LIGHTPATH_CORE_BROKER_ADDR"] = at(by_service["core_broker"][0])
    trees = {s.env.get("LIGHTPATH_AGG_TREE", "") for s in by_service.get("agg_switch", [])}
    if len(trees) == 1 and "" not in trees:
        env["LIGHTPATH_AGG_TREE"] = trees.pop()
    return env


def prometheus_config(
    targets: Sequence[tuple[str, str, str]], *, rule_files: Sequence[str], header: str = ""
) -> str:
    """A Prometheus configuration scraping `targets` ((address, process, service) triples)
    as job lightpath, each labelled with its process and service (what the alert rules and
    dashboards group by), loading `rule_files`. deploy/monitoring's scrape configs and the
    one `lightpath up` writes for the ports it took are made here."""
    lines = [
        header,
        "global:",
        "  scrape_interval: 15s",
        "  evaluation_interval: 15s",
        "rule_files:" if rule_files else "rule_files: []",
        *(f"  - {json.dumps(str(f))}" if "/" in str(f) else f"  - {f}" for f in rule_files),
        "scrape_configs:",
        "  - job_name: lightpath",
        "    metrics_path: /metrics",
        "    static_configs:",
    ]
    for address, process, service in targets:
        lines += [
            f'      - targets: ["{address}"]',
            "        labels:",
            f"          process: {process}",
            f"          service: {service.replace('_', '-')}",
        ]
    return "\n".join(line for line in lines if line) + "\n"


def console_health(url: str, ca_file: str | Path, timeout: float = 2.0) -> str:
    """SERVING / NOT_SERVING / UNREACHABLE of the console at `url` (its /healthz, over
    HTTPS trusting `ca_file`)."""
    import http.client
    import ssl
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        context = ssl.create_default_context(cafile=str(ca_file))
        conn = http.client.HTTPSConnection(
            parts.hostname or "127.0.0.1", parts.port or 443, timeout=timeout, context=context
        )
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
        finally:
            conn.close()
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return "UNREACHABLE"
    return "SERVING" if status == 200 else "NOT_SERVING"


def health_status(
    address: str,
    service: str = "",
    timeout: float = 2.0,
    credentials: Credentials | None = None,
) -> str:
    """SERVING / NOT_SERVING / UNREACHABLE for one endpoint (sync: usable anywhere),
    over TLS with `credentials` (default: `Credentials.default()`)."""
    creds = Credentials.default() if credentials is None else credentials
    channel_creds = creds.channel_credentials()
    try:
        with (
            grpc.insecure_channel(address)
            if channel_creds is None
            else grpc.secure_channel(address, channel_creds)
        ) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
            return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return "UNREACHABLE"


class StackError(RuntimeError):
    pass


SERVICES_DISTRIBUTION = "lightpath-services"


def services_missing(what: str) -> str:
    """Why `what` cannot run here ('' when it can): the servers it starts or whose
    decision code it runs are the second distribution, which a client install lacks."""
    try:
        importlib.import_module("lightpath_services")
    except ImportError:
        pass
    else:
        return ""
    return (
        f"{what} needs Lightpath's services, which this installation does not have "
        f"(`lightpath` is the SDK and CLI only): `pip install {SERVICES_DISTRIBUTION}=="
        f"{__version__}` installs them"
    )


def busy_ports(ports: Mapping[int, str], host: str = "127.0.0.1") -> list[str]:
    """For each port of `ports` (port -> what wants it) that something already listens on:
    "port 50051 (cell-scheduler) is held by pid 123 (python -m lightpath up)"."""
    import socket

    out = []
    for port, what in sorted(ports.items()):
        if not port:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no holder
            try:
                s.bind((host, port))
            except OSError:
                out.append(f"port {port} ({what}) is held by {port_holder(port)}")
    return out


def port_holder(port: int) -> str:
    """Who listens on TCP `port` on this host: "pid 123 (its command line)", from /proc;
    "another process" when that cannot be seen (another user's, or no /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    return f"pid {proc.name} ({cmdline.strip()[:120]})"
        except OSError:
            continue
    return "another process"


class Stack:
    """Redis + the topology's processes. `start()`, `stop()`, or use as a context manager."""

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        specs: list[ProcessSpec] | None = None,
        redis_url: str | None = None,
        redis_port: int = EMBEDDED_REDIS_PORT,
        extra_env: Mapping[str, str] | None = None,
        tls: bool = True,
        console_port: int | None = None,
        console_metrics_port: int | None = None,
        log=print,
    ):
        self.state_dir = state_dir or default_state_dir()
        self.console_port = console_port  # None: no web console
        # The console's Prometheus endpoint: CONSOLE_METRICS_PORT beside the fixed console
        # port, else a free port (0: none).
        if console_metrics_port is None and console_port:
            console_metrics_port = (
                CONSOLE_METRICS_PORT if console_port == CONSOLE_PORT else free_port()
            )
        self.console_metrics_port = (console_metrics_port or 0) if console_port else 0
        self.specs = specs or default_topology()
        self.redis_url = redis_url or os.environ.get("LIGHTPATH_REDIS_URL", "")
        self.redis_password_file = (
            "" if self.redis_url else str(self.secrets_dir / "redis.password")
        )
        self.redis_port = redis_port
        self.extra_env = dict(extra_env or {})
        self.tls = tls
        self.log = log
        self.redis: EmbeddedRedis | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # pki (cryptography's x509) on first use: every CLI command imports this module
        from lightpath.security.pki import LocalCA

        self.ca = LocalCA(pki_dir(self.state_dir))

    @property
    def endpoints(self) -> dict[str, str]:
        return {s.name: f"{s.host}:{s.port}" for s in self.specs}

    @property
    def metrics_endpoints(self) -> dict[str, str]:
        """Each process's Prometheus scrape URL (processes without one are left out), the
        web console's included."""
        out = {s.name: s.metrics_url for s in self.specs if s.metrics_port}
        if self.console_metrics_port:
            out[CONSOLE_NAME] = f"http://127.0.0.1:{self.console_metrics_port}/metrics"
        return out

    @property
    def prometheus_file(self) -> Path:
        return self.state_dir / "prometheus.yml"

    def prometheus_config(self) -> str:
        """A Prometheus configuration for this stack's ports, whichever it took (written to
        `prometheus_file` at start), with the alert rules of the source checkout."""
        targets = [(f"127.0.0.1:{s.metrics_port}", s.name, s.service) for s in self.specs]
        targets = [t for t, s in zip(targets, self.specs, strict=True) if s.metrics_port]
        if self.console_metrics_port:
            targets.append((f"127.0.0.1:{self.console_metrics_port}", CONSOLE_NAME, "console"))
        return prometheus_config(
            targets,
            rule_files=[str(ALERT_RULES)] if ALERT_RULES.exists() else [],
            header=f"# Written by `lightpath up` for the stack in {self.state_dir}:\n"
            f"#   prometheus --config.file={self.prometheus_file}\n",
        )

    @property
    def console_url(self) -> str:
        return f"https://127.0.0.1:{self.console_port}/" if self.console_port else ""

    @property
    def state_file(self) -> Path:
        return self.state_dir / "stack.json"

    @property
    def secrets_dir(self) -> Path:
        return self.state_dir / "secrets"

    @property
    def operator(self) -> Credentials:
        """The operator's credentials on this stack (what the CLI uses by default)."""
        return Credentials.local(Principal(OPERATOR, OPERATOR), self.state_dir, tls=self.tls)

    def start(self, timeout: float = 60.0) -> None:
        """Start everything; StackError at once when a port it needs is taken (a second
        stack's health probes would otherwise reach the first one's services)."""
        missing = services_missing("starting the stack")
        if missing:
            raise StackError(missing)
        wanted = {s.port: s.name for s in self.specs}
        wanted.update({s.metrics_port: f"{s.name} metrics" for s in self.specs if s.metrics_port})
        if not self.redis_url:
            wanted[self.redis_port] = "embedded redis"
        if self.console_port:
            if not self.tls:
                raise StackError("the web console serves HTTPS only: start it on a TLS stack")
            wanted[self.console_port] = "web console"
            if self.console_metrics_port:
                wanted[self.console_metrics_port] = "web console metrics"
        taken = busy_ports(wanted)
        if taken:
            raise StackError(
                "; ".join(taken)
                + ": stop that (`lightpath status` in its directory shows a running stack), "
                "or start this one with `lightpath up --ephemeral-ports`"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        try:
            if not self.redis_url:
                password = _secret_file(Path(self.redis_password_file))
                self.redis = EmbeddedRedis(
                    self.state_dir / "redis", port=self.redis_port, password=password
                )
                self.redis_url = self.redis.start()
                self.log(
                    f"redis            {self.redis_url}  (embedded, password in "
                    f"{self.redis_password_file}, AOF in {self.state_dir / 'redis'})"
                )
            self._issue_identities()
            self._start_in_order(timeout)
            self._wait_pods_registered(timeout)
            self._define_agg_tree()
            if self.console_port:
                self._spawn_console()
                self._wait_console(timeout)
        except BaseException:
            self.stop()
            raise
        self.prometheus_file.write_text(self.prometheus_config())
        write_private(
            self.state_file,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "redis_url": self.redis_url,
                    "redis_password_file": self.redis_password_file,
                    "tls": self.tls,
                    "endpoints": self.endpoints,
                    "metrics": self.metrics_endpoints,
                    "console": self.console_url,
                    "prometheus_config": str(self.prometheus_file),
                    "started_at": time.time(),
                },
                indent=2,
            ),
        )

    def _define_agg_tree(self) -> None:
        """The default aggregation tree, when this stack runs its switches and the tree has
        no topology yet."""
        switches = {
            s.env.get("LIGHTPATH_SWITCH_ID"): s
            for s in self.specs
            if s.service == "agg_switch" and s.env.get("LIGHTPATH_AGG_TREE") == AGG_TREE
        }
        if not {"root", *AGG_TREE_NODES} <= set(switches):
            return
        import asyncio

        address = f"127.0.0.1:{switches['root'].port}"
        root = switches["root"]
        if asyncio.run(define_default_agg_tree(address, self.operator, root.principal)):
            self.log(
                f"aggregation      tree {AGG_TREE} defined: root over sub-1 "
                f"[{' '.join(AGG_TREE_NODES['sub-1'])}] and sub-2 "
                f"[{' '.join(AGG_TREE_NODES['sub-2'])}] (`lightpath agg topology`)"
            )

    def _issue_identities(self) -> None:
        """Certificates (TLS) or bearer tokens (plaintext) for every process and the operator."""
        principals = [Principal(OPERATOR, OPERATOR), *(s.principal for s in self.specs)]
        if self.console_port:
            principals.append(console_principal())
        self.ca.ensure()
        if self.tls:
            hosts = {s.principal: (s.host,) for s in self.specs if s.host != "127.0.0.1"}
            for p in principals:
                self.ca.issue(p, hosts=hosts.get(p, ()))
            return
        import asyncio

        asyncio.run(
            issue_local_tokens(self.state_dir, self.redis_url, self.redis_password_file, principals)
        )

    def _security_env(self, spec: ProcessSpec) -> dict[str, str]:
        env = {"LIGHTPATH_AUDIT_LOG": str(self.state_dir / "audit" / f"{spec.name}.jsonl")}
        if self.redis_password_file:
            env["LIGHTPATH_REDIS_PASSWORD_FILE"] = self.redis_password_file
        if self.tls:
            files = self.ca.paths(spec.principal)
            env.update(
                LIGHTPATH_TLS_CERT=str(files.cert),
                LIGHTPATH_TLS_KEY=str(files.key),
                LIGHTPATH_TLS_CA=str(files.ca),
                LIGHTPATH_PLAINTEXT="false",
            )
        else:
            env.update(
                LIGHTPATH_PLAINTEXT="true",
                LIGHTPATH_TOKEN_FILE=str(token_path(self.state_dir, spec.principal)),
            )
        return env

    def _spawn(self, spec: ProcessSpec) -> None:
        env = {
            **os.environ,
            **self.extra_env,
            **process_env(spec, self.specs, self.redis_url),
            **self._security_env(spec),
        }
        # Where a service keeps files of its own (the core broker's graph data and runs).
        env.setdefault("LIGHTPATH_STATE_DIR", str(self.state_dir))
        if spec.metrics_port:
            env["LIGHTPATH_METRICS_LISTEN"] = f"{spec.host}:{spec.metrics_port}"
        self._popen(spec.name, spec.service, env, spec.netns)

    def _spawn_console(self) -> None:
        """The web console: its own certificate, the services' addresses, no Redis (it is a
        client of their gRPC API only)."""
        assert self.console_port
        files = self.ca.paths(console_principal())
        env = {
            k: v
            for k, v in {**os.environ, **self.extra_env}.items()
            if not k.startswith(("LIGHTPATH_REDIS", "LIGHTPATH_TOKEN"))
        }
        env.update(console_env(self.specs, self.console_port))
        if self.console_metrics_port:
            env["LIGHTPATH_METRICS_LISTEN"] = f"127.0.0.1:{self.console_metrics_port}"
        env.update(
            LIGHTPATH_TLS_CERT=str(files.cert),
            LIGHTPATH_TLS_KEY=str(files.key),
            LIGHTPATH_TLS_CA=str(files.ca),
        )
        self._popen(CONSOLE_NAME, "console", env)

    def _wait_console(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while console_health(self.console_url, self.ca.cert_path, 0.5) != "SERVING":
            self._check_alive(CONSOLE_NAME)
            if time.monotonic() > deadline:
                raise StackError(
                    "the web console is not healthy in time" + self._log_tails([CONSOLE_NAME])
                )
            time.sleep(0.1)

    def _popen(self, name: str, service: str, env: dict[str, str], netns: str = "") -> None:
        env.setdefault("LIGHTPATH_INSTANCE_ID", name)
        env.setdefault("LIGHTPATH_LOG_FORMAT", "json")
        logs = self.state_dir / "logs"
        # The JSON-lines log (stderr) apart from what console exporters print (stdout).
        # Owner-only, as the audit logs: they name callers, jobs and errors (issue 30).
        logfile = open_private_append(logs / f"{name}.log")
        otelfile = open_private_append(logs / f"{name}.otel.jsonl")
        try:
            # `ip netns exec` execs the service: the pid is the service's own
            inside = ["ip", "netns", "exec", netns] if netns else []
            self.procs[name] = subprocess.Popen(
                dies_with_parent([*inside, sys.executable, "-m", f"lightpath_services.{service}"]),
                env=env,
                stdout=otelfile,
                stderr=logfile,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            logfile.close()
            otelfile.close()

    def _start_in_order(self, timeout: float) -> None:
        """Spawn each process once every other process it points at (its peers) is healthy,
        and wait until all are: the start order of `default_topology`. Started together, an
        ocs_manager asked its switch agent before that listened, and its channel, refused,
        then failed calls fast for its reconnect backoff (1 s and growing) although both
        were healthy: the first WireSlice after `up` was UNAVAILABLE on a loaded host."""
        deadline = time.monotonic() + timeout
        names = {s.name for s in self.specs}
        waiting = {s.name: s for s in self.specs}  # not spawned yet
        starting: dict[str, ProcessSpec] = {}  # spawned, not healthy yet
        healthy: set[str] = set()
        creds = self.operator
        while waiting or starting:
            ready = [
                name
                for name, spec in waiting.items()
                if {p for p in spec.peers.values() if p in names and p != name} <= healthy
            ]
            if not ready and not starting:  # peers that point at each other: all at once
                ready = list(waiting)
            for name in ready:
                self._spawn(waiting[name])
                starting[name] = waiting.pop(name)
            for name, spec in list(starting.items()):
                self._check_alive(name)
                status = health_status(f"{spec.host}:{spec.port}", timeout=0.5, credentials=creds)
                if status == "SERVING":
                    healthy.add(name)
                    del starting[name]
            pending = [*starting, *waiting]
            if pending and time.monotonic() > deadline:
                raise StackError(
                    "not healthy in time: " + ", ".join(sorted(pending)) + self._log_tails(pending)
                )
            if starting:
                time.sleep(0.1)

    def _wait_pods_registered(self, timeout: float) -> None:
        """Until the cell lists every pod this stack runs: a scheduler is healthy before its
        first registration reaches the cell, and a submit in between would be refused with
        "no superpod has registered" although `lightpath up` said the stack was ready."""
        cells = [s for s in self.specs if s.service == "cell_scheduler"]
        pods = {
            s.env["LIGHTPATH_POD_ID"]: s.name
            for s in self.specs
            if s.service == "workload_scheduler" and "LIGHTPATH_POD_ID" in s.env
        }
        if not cells or not pods:
            return
        import asyncio

        from lightpath.client import channel
        from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc

        async def registered() -> set[str]:
            async with channel(
                self.endpoints[cells[0].name], credentials=self.operator, expect=cells[0].principal
            ) as ch:
                listed = await cell_scheduler_pb2_grpc.CellSchedulerStub(ch).ListPods(
                    cell_scheduler_pb2.ListPodsRequest(), timeout=2.0
                )
            return {p.registration.pod_id for p in listed.pods}

        deadline = time.monotonic() + timeout
        while True:
            try:
                missing = set(pods) - asyncio.run(registered())
            except grpc.RpcError:
                missing = set(pods)
            if not missing:
                return
            for name in [pods[p] for p in missing] + [cells[0].name]:
                self._check_alive(name)
            if time.monotonic() > deadline:
                raise StackError(
                    "not registered with the cell in time: "
                    + ", ".join(sorted(missing))
                    + self._log_tails([pods[p] for p in missing])
                )
            time.sleep(0.1)

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise StackError(f"{name} exited with code {proc.returncode}" + self._log_tails([name]))

    def _log_tails(self, names) -> str:
        out = []
        for name in names:
            path = self.state_dir / "logs" / f"{name}.log"
            if path.exists():
                out.append(
                    f"\n--- {path} (last lines) ---\n"
                    + "\n".join(path.read_text().splitlines()[-15:])
                )
        return "".join(out)

    def dead_processes(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every child (services drain in-flight calls), SIGKILL what outlives `grace`."""
        procs = list(self.procs.items())[::-1]
        for _, p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        with contextlib.suppress(FileNotFoundError):
            if (
                self.state_file.exists()
                and json.loads(self.state_file.read_text()).get("pid") == os.getpid()
            ):
                self.state_file.unlink()

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class StackInfo:
    """What a running `lightpath up` wrote to its state file."""

    pid: int
    redis_url: str
    endpoints: dict[str, str]
    redis_password_file: str = ""
    tls: bool = True
    metrics: dict[str, str] = field(default_factory=dict)  # process -> scrape URL
    console: str = ""  # the web console's URL ("" when it was not started)
    prometheus_config: str = ""  # a Prometheus configuration for the ports it took


def running_stack(state_dir: Path | None = None) -> StackInfo | None:
    """The stack a live `lightpath up` is serving, or None."""
    path = (state_dir or default_state_dir()) / "stack.json"
    try:
        data = json.loads(path.read_text())
        os.kill(int(data["pid"]), 0)
    except (FileNotFoundError, ValueError, KeyError, ProcessLookupError, PermissionError):
        return None
    return StackInfo(
        int(data["pid"]),
        data["redis_url"],
        dict(data["endpoints"]),
        data.get("redis_password_file", ""),
        bool(data.get("tls", True)),
        dict(data.get("metrics", {})),
        str(data.get("console", "")),
        str(data.get("prometheus_config", "")),
    )


class NoStack(LookupError):
    """No address setting, no context address and no running local stack for a process:
    the message names the stack directory tried and where that came from."""


# Whether `located` falls back to the stack's default port when it finds no stack (the
# SDK's documented behaviour); the CLI turns it off for its commands, which then say which
# stack they looked for (NoStack) rather than dial a port another user's stack may hold.
DEFAULT_PORT_FALLBACK = [True]


def endpoint(
    name: str, env_var: str, state_dir: Path | None = None, *, default_port: bool | None = None
) -> str:
    """Where to reach `name`: $env_var, else the context in use (lightpath.config), else the
    running local stack, else the default port (`default_port` False: NoStack instead)."""
    return located(name, env_var, state_dir, default_port=default_port)[0]


def located(
    name: str, env_var: str, state_dir: Path | None = None, *, default_port: bool | None = None
) -> tuple[str, str]:
    """`endpoint`'s answer and where it came from, for messages: "LIGHTPATH_CELL_ADDR",
    "the local stack in .lightpath" or "the local stack's default port: no stack ..."
    `default_port` None: DEFAULT_PORT_FALLBACK."""
    from lightpath.config import current_context
    from lightpath.paths import state_dir_and_source

    if default_port is None:
        default_port = DEFAULT_PORT_FALLBACK[-1]

    if os.environ.get(env_var):
        return os.environ[env_var], env_var
    context = current_context()
    if context is not None and name in context.addresses:
        return context.addresses[name], f"context {context.name} in {context.path}"
    directory, source = (state_dir, "") if state_dir else state_dir_and_source()
    stack = running_stack(directory)
    if stack and name in stack.endpoints:
        return stack.endpoints[name], f"the local stack in {directory}"
    where = f"{directory} ({source})" if source else str(directory)
    known = {spec.name for spec in default_topology()}
    if stack is None and not default_port and name in known:
        raise NoStack(
            f"no stack at {where}; start one with `lightpath up`, or name another with "
            f"--context / --state-dir (or give {env_var})"
        )
    for spec in default_topology() if default_port else ():
        if spec.name == name:
            return (
                f"127.0.0.1:{spec.port}",
                f"the local stack's default port: no stack is running in {where} "
                f"and {env_var} is unset",
            )
    raise KeyError(name)


def _secret_file(path: Path) -> str:
    """The secret kept in `path`, made (256 random bits, 0600) on first use."""
    import secrets

    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    value = secrets.token_urlsafe(32)
    write_private(path, value + "\n")
    return value


async def issue_local_tokens(
    state_dir: Path, redis_url: str, password_file: str, principals: list[Principal]
) -> dict[Principal, str]:
    """Bearer tokens for `principals`, registered in the stack's Redis and kept 0600 beside the
    certificates (a plaintext stack's identities; `lightpath tenant create --token`)."""
    from lightpath.security.tokens import TokenRegistry

    client = local_redis(redis_url, password_file)
    try:
        registry = TokenRegistry(client)
        out = {}
        for p in principals:
            _, token = await registry.issue(p)
            write_private(token_path(state_dir, p), token + "\n")
            out[p] = token
        return out
    finally:
        await client.aclose()


def local_redis(redis_url: str, password_file: str):
    """An async client of the local stack's Redis (one server, a cluster or a sentinel
    set: lightpath.redis_url), with its password."""
    from lightpath import redis_url as urls

    password = Path(password_file).read_text().strip() if password_file else None
    return urls.client(redis_url, password=password)


@contextlib.contextmanager
def ensure_stack(state_dir: Path | None = None, log=print) -> Iterator[dict[str, str]]:
    """Endpoints of the running stack, or of a private one started (on free ports) for the block."""
    stack = running_stack(state_dir)
    if stack is not None:
        log(f"using the running stack (pid {stack.pid})")
        with _state_dir_env(state_dir or default_state_dir()):
            yield stack.endpoints
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lightpath-demo-") as tmp:
        log("no stack running: starting one on free ports for this run")
        with (
            Stack(
                Path(tmp), specs=with_ephemeral_ports(default_topology()), redis_port=0, log=log
            ) as st,
            _state_dir_env(Path(tmp)),
        ):
            yield st.endpoints


@contextlib.contextmanager
def _state_dir_env(state_dir: Path) -> Iterator[None]:
    """Clients in this process find the stack's credentials (Credentials.default) for the block."""
    saved = os.environ.get("LIGHTPATH_STATE_DIR")
    os.environ["LIGHTPATH_STATE_DIR"] = str(state_dir)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LIGHTPATH_STATE_DIR", None)
        else:
            os.environ["LIGHTPATH_STATE_DIR"] = saved
