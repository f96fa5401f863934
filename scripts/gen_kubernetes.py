#!/usr/bin/env python3
"""Write deploy/kubernetes/ (Kustomize) from the local stack's topology (lightpath/stack.py).

    python scripts/gen_kubernetes.py            # write deploy/kubernetes/
    python scripts/gen_kubernetes.py --render   # print the overlay as `kubectl kustomize` would
    python scripts/gen_kubernetes.py --lock     # write deploy/requirements.lock from .venv
    python scripts/gen_kubernetes.py --secret-commands deploy/secrets   # kubectl create secret ...

The same topology (`deployed_topology()`: the local stack with switch agents) and
`process_env()` that `lightpath up` runs and
scripts/gen_compose.py writes into deploy/docker-compose.yml make every object
here, so the three cannot drift; tests/test_kubernetes.py fails when the
committed YAML is not what this script writes, renders the overlay and checks
every object against the Kubernetes schemas and the code.

    base/              what every Lightpath deployment shares: the settings ConfigMap,
                       a default-deny NetworkPolicy, DNS and Redis egress
    overlays/stack/    the local stack's processes: per process a ServiceAccount,
                       Service, Deployment, PodDisruptionBudget and NetworkPolicy;
                       and the web console (console.yaml: HTTPS, a client of the
                       services' gRPC API only, no Redis, sign-in required)
    monitoring/        for prometheus-operator: a metrics Service over every
                       Lightpath pod, its ServiceMonitor, the alert rules as a
                       PrometheusRule and the NetworkPolicy letting Prometheus in
                       (`kubectl apply -k deploy/kubernetes/monitoring`; needs the
                       operator's CRDs, so the overlay does not include it)

No secret value is ever written: Deployments mount Secrets by name
(docs/operations.md says how to make them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lightpath.security.identity import console_principal  # noqa: E402
from lightpath.stack import (  # noqa: E402
    CONSOLE_NAME,
    CONSOLE_PORT,
    ProcessSpec,
    console_env,
    deployed_topology,
    process_env,
)

OUT = ROOT / "deploy" / "kubernetes"
LOCK = ROOT / "deploy" / "requirements.lock"
NAMESPACE = "lightpath"
IMAGE = "lightpath"
PART_OF = "lightpath"

# The external Redis (docs/operations.md): an operator-run or managed Redis,
# named by URL. The ports the egress policy opens: Redis and Sentinel.
REDIS_URL = "redis://redis.redis.svc.cluster.local:6379/0"
REDIS_PORTS = (6379, 26379)

# Where a pod finds its credentials (one projected volume of Secrets).
CREDENTIALS_DIR = "/var/run/lightpath"
CA_SECRET = "lightpath-ca"  # key ca.crt: the CA every certificate chains to
REDIS_SECRET = "lightpath-redis"  # key password
CB_OPERATOR_TOKEN_SECRET = "lightpath-core-broker-operator-token"  # key token, optional

# Replicas the design allows (docs/<service>.md): cell, workload schedulers,
# ocs managers and the core broker coordinate through Redis (atomic Lua
# scripts, per-slice change leases, a per-pod lease, the broker's change
# stream), so replicas run side by side. An agg_switch is one switch of the
# tree: its chunks in flight live in its memory and its address is registered
# under its switch id, so it runs once and is replaced, never doubled.
REPLICAS = {
    "cell_scheduler": 2,
    "workload_scheduler": 2,
    "ocs_manager": 2,
    "core_broker": 2,
    "agg_switch": 1,
    "switch_agent": 1,  # it is the pod's switches (their tables in its memory): never doubled
}

# Idle resident memory of each process is 75-90 MiB (`lightpath up`, 2026-11-25);
# limits leave room for a full pod's tables, the broker's device schedules and
# the switch's aggregation slots (LIGHTPATH_AGG_SLOTS x chunk bytes).
RESOURCES = {
    "cell_scheduler": ("250m", "192Mi", "1", "512Mi"),
    "workload_scheduler": ("250m", "192Mi", "1", "512Mi"),
    "ocs_manager": ("250m", "192Mi", "1", "768Mi"),
    "core_broker": ("500m", "256Mi", "2", "1Gi"),
    "agg_switch": ("500m", "256Mi", "2", "1Gi"),
    "switch_agent": ("100m", "128Mi", "1", "256Mi"),
}

# Who outside the stack may call (besides every pod labelled as an operator):
# job systems the cell, edge applications the broker, compute nodes the switches.
CLIENT_LABEL = "lightpath.io/client"
OPERATOR_LABEL = "lightpath.io/operator"
FRONT_DOORS = {"cell_scheduler", "core_broker", "agg_switch"}

# The web console (services/console, issue 21) reads these services over gRPC. Its pod is
# not `part-of: lightpath` (no Redis egress, no metrics scrape: it has neither); its own
# NetworkPolicy opens DNS, the services it reads, and its HTTPS port to operators' pods
# and pods labelled lightpath.io/client=console (`kubectl port-forward` reaches it too).
CONSOLE_READS = {"cell_scheduler", "ocs_manager", "core_broker", "agg_switch"}
CONSOLE_SELECTOR = {"lightpath.io/process": CONSOLE_NAME}
CONSOLE_LABELS = {
    "app.kubernetes.io/name": "console",
    "app.kubernetes.io/instance": CONSOLE_NAME,
    "app.kubernetes.io/component": "web-console",
    **CONSOLE_SELECTOR,
}
CONSOLE_RESOURCES = ("100m", "128Mi", "1", "384Mi")

# What every service reads from the shared ConfigMap (CommonSettings only).
COMMON_SETTINGS = {
    "LIGHTPATH_REDIS_URL": REDIS_URL,
    "LIGHTPATH_TLS_CLIENT_AUTH": "require",
    "LIGHTPATH_PLAINTEXT": "false",
    "LIGHTPATH_LOG_FORMAT": "json",
    "LIGHTPATH_LOG_LEVEL": "info",
    "LIGHTPATH_AUDIT_LOG": "-",
    "LIGHTPATH_AUDIT_LEVEL": "metadata",
    "LIGHTPATH_SHUTDOWN_GRACE_S": "5.0",
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    # Every pod serves Prometheus metrics here (deploy/monitoring; monitoring/ scrapes it).
    "LIGHTPATH_METRICS_LISTEN": "0.0.0.0:9464",
}
METRICS_PORT = 9464
# Where Prometheus runs (monitoring/network.yaml lets it in): the namespace of
# kube-prometheus-stack's Prometheus by default.
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}

HEADER = (
    "# Written by scripts/gen_kubernetes.py from lightpath/stack.py: do not edit;\n"
    "# change the topology or the script and run it again (tests/test_kubernetes.py\n"
    "# fails on a stale file).\n"
)


def labels(spec: ProcessSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": spec.service.replace("_", "-"),
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/part-of": PART_OF,
        "lightpath.io/process": spec.name,
    }


def selector(spec: ProcessSpec) -> dict[str, str]:
    return {"lightpath.io/process": spec.name}


def calls(specs: list[ProcessSpec]) -> set[tuple[str, str]]:
    """(caller, callee) process names: every gRPC call one Lightpath process makes to another.

    A peer variable is a direct call (a workload scheduler to its ocs_manager and
    to the cell); an advertised address is how others call back: the cell calls the
    workload schedulers that register with it, and every switch of a tree calls
    the others (Relay), each found by the address it registered."""
    out: set[tuple[str, str]] = set()
    for s in specs:
        for var, peer in s.peers.items():
            if var != "LIGHTPATH_ADVERTISE_ADDR":
                out.add((s.name, peer))
        if "LIGHTPATH_ADVERTISE_ADDR" in s.peers and "LIGHTPATH_CELL_ADDR" in s.peers:
            out.add((s.peers["LIGHTPATH_CELL_ADDR"], s.name))
    trees: dict[str, list[str]] = {}
    for s in specs:
        if s.service == "agg_switch":
            trees.setdefault(s.env.get("LIGHTPATH_AGG_TREE", "tree-1"), []).append(s.name)
    for members in trees.values():
        out.update((a, b) for a in members for b in members if a != b)
    return out


def probe_command(port: int, *, serving_only: bool) -> list[str]:
    """gRPC health over the pod's own mTLS (the service's certificate names 127.0.0.1).

    The kubelet's native `grpc:` probe cannot be used: it speaks plaintext (or, from
    Kubernetes 1.37, unverified TLS) and never presents a client certificate, which
    every Lightpath port requires. Readiness
    asks for SERVING; liveness and startup only for an answer, so a service
    that reports NOT_SERVING while Redis is away is taken out of its Service,
    not restarted (it recovers by itself, see services/common/supervisor.py)."""
    if serving_only:
        return ["python", "-m", "lightpath.healthcheck", f"127.0.0.1:{port}"]
    return [
        "python",
        "-c",
        "import sys; from lightpath.stack import health_status; "
        f"sys.exit(health_status('127.0.0.1:{port}') == 'UNREACHABLE')",
    ]


def container_env(spec: ProcessSpec, specs: list[ProcessSpec]) -> list[dict[str, Any]]:
    env = process_env(spec, specs, REDIS_URL, host="compose")
    del env["LIGHTPATH_REDIS_URL"]  # from the ConfigMap
    if spec.service == "agg_switch":
        # Pods never share /dev/shm with compute nodes in other pods.
        env["LIGHTPATH_AGG_TRANSPORT"] = "grpc"
    env["LIGHTPATH_TLS_CERT"] = f"{CREDENTIALS_DIR}/tls.crt"
    env["LIGHTPATH_TLS_KEY"] = f"{CREDENTIALS_DIR}/tls.key"
    env["LIGHTPATH_TLS_CA"] = f"{CREDENTIALS_DIR}/ca.crt"
    env["LIGHTPATH_REDIS_PASSWORD_FILE"] = f"{CREDENTIALS_DIR}/redis.password"
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    out.append(
        {"name": "LIGHTPATH_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    if spec.service == "core_broker":
        out.append(
            {
                "name": "LIGHTPATH_CB_OPERATOR_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": CB_OPERATOR_TOKEN_SECRET,
                        "key": "token",
                        "optional": True,
                    }
                },
            }
        )
    return out


def tls_secret(spec: ProcessSpec) -> str:
    return f"{spec.name}-tls"


def deployment(spec: ProcessSpec, specs: list[ProcessSpec]) -> dict[str, Any]:
    replicas = REPLICAS[spec.service]
    cpu_req, mem_req, cpu_lim, mem_lim = RESOURCES[spec.service]
    probe = {"timeoutSeconds": 5}
    strategy: dict[str, Any] = (
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
        if replicas > 1
        else {"type": "Recreate"}
    )
    pod_labels = labels(spec)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": spec.name, "labels": pod_labels},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 5,
            "strategy": strategy,
            "selector": {"matchLabels": selector(spec)},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": spec.name,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 20,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector(spec)},
                        }
                    ],
                    "containers": [
                        {
                            "name": spec.service.replace("_", "-"),
                            "image": f"{IMAGE}:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [spec.console_script],
                            "ports": [
                                {"name": "grpc", "containerPort": spec.port, "protocol": "TCP"}
                                # metrics: a later issue adds a port here for the ServiceMonitor
                            ],
                            "envFrom": [{"configMapRef": {"name": "lightpath-settings"}}],
                            "env": container_env(spec, specs),
                            "resources": {
                                "requests": {"cpu": cpu_req, "memory": mem_req},
                                "limits": {"cpu": cpu_lim, "memory": mem_lim},
                            },
                            "startupProbe": {
                                "exec": {"command": probe_command(spec.port, serving_only=False)},
                                "periodSeconds": 5,
                                "failureThreshold": 24,
                                **probe,
                            },
                            "readinessProbe": {
                                "exec": {"command": probe_command(spec.port, serving_only=True)},
                                "periodSeconds": 10,
                                "failureThreshold": 2,
                                **probe,
                            },
                            "livenessProbe": {
                                "exec": {"command": probe_command(spec.port, serving_only=False)},
                                "periodSeconds": 20,
                                "failureThreshold": 3,
                                **probe,
                            },
                            # Endpoints drop the pod before SIGTERM starts the drain.
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "3"]}}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {
                                    "name": "credentials",
                                    "mountPath": CREDENTIALS_DIR,
                                    "readOnly": True,
                                },
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "credentials",
                            "projected": {
                                "defaultMode": 0o440,
                                "sources": [
                                    {
                                        "secret": {
                                            "name": tls_secret(spec),
                                            "items": [
                                                {"key": "tls.crt", "path": "tls.crt"},
                                                {"key": "tls.key", "path": "tls.key"},
                                            ],
                                        }
                                    },
                                    {
                                        "secret": {
                                            "name": CA_SECRET,
                                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                        }
                                    },
                                    {
                                        "secret": {
                                            "name": REDIS_SECRET,
                                            "items": [
                                                {"key": "password", "path": "redis.password"}
                                            ],
                                        }
                                    },
                                ],
                            },
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }


def service(spec: ProcessSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "labels": labels(spec)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector(spec),
            "ports": [
                {
                    "name": "grpc",
                    "port": spec.port,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "grpc",
                }
            ],
        },
    }


def service_account(spec: ProcessSpec) -> dict[str, Any]:
    # No Kubernetes API calls: the token is not mounted (Deployment) nor needed.
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": spec.name, "labels": labels(spec)},
        "automountServiceAccountToken": False,
    }


def disruption_budget(spec: ProcessSpec) -> dict[str, Any]:
    # Replicated: keep one serving through a drain. A single switch: may be evicted
    # (its commands fail naming the missing switch, clients retry); stated, not implied.
    budget = {"minAvailable": 1} if REPLICAS[spec.service] > 1 else {"maxUnavailable": 1}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": spec.name, "labels": labels(spec)},
        "spec": {**budget, "selector": {"matchLabels": selector(spec)}},
    }


def network_policy(spec: ProcessSpec, specs: list[ProcessSpec]) -> dict[str, Any]:
    """Ingress on its gRPC port from the processes that call it (and outside callers
    by label); egress to the processes it calls. DNS and Redis: base/network.yaml."""
    by_name = {s.name: s for s in specs}
    edges = calls(specs)
    callers = sorted(a for a, b in edges if b == spec.name)
    callees = sorted(b for a, b in edges if a == spec.name)
    port = [{"protocol": "TCP", "port": spec.port}]
    sources: list[dict[str, Any]] = [
        {"podSelector": {"matchLabels": selector(by_name[c])}} for c in callers
    ]
    sources.append(
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {OPERATOR_LABEL: "true"}}}
    )
    if spec.service in CONSOLE_READS:
        sources.append({"podSelector": {"matchLabels": CONSOLE_SELECTOR}})
    if spec.service in FRONT_DOORS:
        sources.append(
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {CLIENT_LABEL: spec.service.replace("_", "-")}},
            }
        )
    policy_spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector(spec)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": sources, "ports": port}],
        "egress": [
            {
                "to": [{"podSelector": {"matchLabels": selector(by_name[c])}}],
                "ports": [{"protocol": "TCP", "port": by_name[c].port}],
            }
            for c in callees
        ],
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": spec.name, "labels": labels(spec)},
        "spec": policy_spec,
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: each object stands alone
        return True


def dump(docs: Iterable[Mapping[str, Any]], comment: str = "") -> str:
    parts = [
        yaml.dump(dict(d), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
        for d in docs
    ]
    # 0440 (r--r-----, YAML 1.1 octal as Kubernetes reads it) rather than its decimal 288
    text = "---\n".join(parts).replace("defaultMode: 288\n", "defaultMode: 0440\n")
    return HEADER + comment + "---\n" + text


def base_files() -> dict[str, str]:
    part_of = {"app.kubernetes.io/part-of": PART_OF}
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "lightpath-settings", "labels": part_of},
        "data": dict(COMMON_SETTINGS),
    }
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "lightpath-default-deny", "labels": part_of},
        "spec": {"podSelector": {"matchLabels": part_of}, "policyTypes": ["Ingress", "Egress"]},
    }
    dns = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "lightpath-dns-egress", "labels": part_of},
        "spec": {
            "podSelector": {"matchLabels": part_of},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                }
            ],
        },
    }
    redis = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "lightpath-redis-egress", "labels": part_of},
        "spec": {
            "podSelector": {"matchLabels": part_of},
            "policyTypes": ["Egress"],
            "egress": [{"ports": [{"protocol": "TCP", "port": p} for p in REDIS_PORTS]}],
        },
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["settings.yaml", "network.yaml"],
    }
    return {
        "base/kustomization.yaml": dump(
            [kustomization],
            "#\n# Shared by every Lightpath deployment; overlays add the processes.\n"
            "# Every pod serves Prometheus metrics on port 9464 (LIGHTPATH_METRICS_LISTEN in\n"
            "# settings.yaml); the ServiceMonitor and alert rules that scrape and watch them\n"
            "# are in ../monitoring (prometheus-operator CRDs): kubectl apply -k that too.\n",
        ).replace("---\n", "", 1),
        "base/settings.yaml": dump(
            [settings],
            "#\n# Settings every service reads (docs/configuration.md). LIGHTPATH_REDIS_URL\n"
            "# names the external Redis, in one of these forms (docs/operations.md):\n"
            "#   one server (rediss:// with TLS):\n"
            "#     rediss://redis.example.net:6380/0\n"
            "#   a Redis Cluster, by some of its nodes (rediss+cluster:// with TLS):\n"
            "#     redis+cluster://redis-0.redis.redis.svc:6379,redis-1.redis.redis.svc:6379\n"
            "#   the master a set of Sentinels names, /SERVICE_NAME[/DB] (rediss+sentinel://):\n"
            "#     redis+sentinel://sentinel-0.redis.redis.svc:26379,sentinel-1.redis.redis.svc:26379/mymaster/0\n"
            "# Its password is never here: Secret lightpath-redis, key password\n"
            "# (LIGHTPATH_REDIS_PASSWORD_FILE in each Deployment).\n",
        ),
        "base/network.yaml": dump(
            [deny, dns, redis],
            "#\n# Nothing in or out of a Lightpath pod unless a policy says so. Redis egress\n"
            "# is by port only (6379 Redis and Cluster, 26379 Sentinel): narrow `to:` in\n"
            "# your overlay to the Redis namespace or the managed service's CIDR.\n",
        ),
    }


def console_objects(specs: list[ProcessSpec]) -> list[dict[str, Any]]:
    """The web console: ServiceAccount, Service, Deployment, PodDisruptionBudget and its
    NetworkPolicy. One replica: sign-ins live in its memory (a restart signs viewers out).
    LIGHTPATH_CONSOLE_ANONYMOUS stays `auto`, which, listening beyond loopback, means a
    viewer must sign in with a bearer token (docs/console.md)."""
    env = console_env(specs, CONSOLE_PORT, host="compose")
    env.update(
        LIGHTPATH_TLS_CERT=f"{CREDENTIALS_DIR}/tls.crt",
        LIGHTPATH_TLS_KEY=f"{CREDENTIALS_DIR}/tls.key",
        LIGHTPATH_TLS_CA=f"{CREDENTIALS_DIR}/ca.crt",
        LIGHTPATH_LOG_FORMAT="json",
    )
    container_env = [{"name": k, "value": v} for k, v in env.items()]
    container_env.append(
        {"name": "LIGHTPATH_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    url = f"https://127.0.0.1:{CONSOLE_PORT}/"

    def probe(serving_only: bool) -> list[str]:
        wrong = "!= 'SERVING'" if serving_only else "== 'UNREACHABLE'"
        return [
            "python",
            "-c",
            "import sys; from lightpath.stack import console_health; "
            f"sys.exit(console_health('{url}', '{CREDENTIALS_DIR}/ca.crt') {wrong})",
        ]

    cpu_req, mem_req, cpu_lim, mem_lim = CONSOLE_RESOURCES
    meta = {"name": CONSOLE_NAME, "labels": CONSOLE_LABELS}
    shown = sorted(s.name for s in specs if s.service in CONSOLE_READS)
    by_name = {s.name: s for s in specs}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 5,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "selector": {"matchLabels": CONSOLE_SELECTOR},
            "template": {
                "metadata": {"labels": CONSOLE_LABELS},
                "spec": {
                    "serviceAccountName": CONSOLE_NAME,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "console",
                            "image": f"{IMAGE}:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["lightpath-console"],
                            "ports": [
                                {"name": "https", "containerPort": CONSOLE_PORT, "protocol": "TCP"}
                            ],
                            "env": container_env,
                            "resources": {
                                "requests": {"cpu": cpu_req, "memory": mem_req},
                                "limits": {"cpu": cpu_lim, "memory": mem_lim},
                            },
                            "startupProbe": {
                                "exec": {"command": probe(False)},
                                "periodSeconds": 5,
                                "failureThreshold": 24,
                                "timeoutSeconds": 5,
                            },
                            "readinessProbe": {
                                "exec": {"command": probe(True)},
                                "periodSeconds": 10,
                                "failureThreshold": 2,
                                "timeoutSeconds": 5,
                            },
                            "livenessProbe": {
                                "exec": {"command": probe(False)},
                                "periodSeconds": 20,
                                "failureThreshold": 3,
                                "timeoutSeconds": 5,
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {
                                    "name": "credentials",
                                    "mountPath": CREDENTIALS_DIR,
                                    "readOnly": True,
                                },
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "credentials",
                            "projected": {
                                "defaultMode": 0o440,
                                "sources": [
                                    {
                                        "secret": {
                                            "name": f"{CONSOLE_NAME}-tls",
                                            "items": [
                                                {"key": "tls.crt", "path": "tls.crt"},
                                                {"key": "tls.key", "path": "tls.key"},
                                            ],
                                        }
                                    },
                                    {
                                        "secret": {
                                            "name": CA_SECRET,
                                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                        }
                                    },
                                ],
                            },
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                    ],
                },
            },
        },
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": CONSOLE_SELECTOR},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {OPERATOR_LABEL: "true"}},
                        },
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {CLIENT_LABEL: "console"}},
                        },
                    ],
                    "ports": [{"protocol": "TCP", "port": CONSOLE_PORT}],
                }
            ],
            "egress": [
                {
                    "to": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                        }
                    ],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                *(
                    {
                        "to": [{"podSelector": {"matchLabels": selector(by_name[n])}}],
                        "ports": [{"protocol": "TCP", "port": by_name[n].port}],
                    }
                    for n in shown
                ),
            ],
        },
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta,
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "type": "ClusterIP",
                "selector": CONSOLE_SELECTOR,
                "ports": [
                    {
                        "name": "https",
                        "port": CONSOLE_PORT,
                        "targetPort": "https",
                        "protocol": "TCP",
                        "appProtocol": "https",
                    }
                ],
            },
        },
        deployment,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": CONSOLE_SELECTOR}},
        },
        policy,
    ]


def overlay_files(specs: list[ProcessSpec]) -> dict[str, str]:
    files: dict[str, str] = {}
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": NAMESPACE,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "app.kubernetes.io/part-of": PART_OF,
            },
        },
    }
    files["overlays/stack/namespace.yaml"] = dump([namespace])
    for s in specs:
        files[f"overlays/stack/{s.name}.yaml"] = dump(
            [
                service_account(s),
                service(s),
                deployment(s, specs),
                disruption_budget(s),
                network_policy(s, specs),
            ],
            f"#\n# {s.name}: {s.service}, port {s.port}; its certificate: Secret "
            f"{tls_secret(s)} (tls.crt, tls.key)\n# naming {s.name} and {s.principal.uri}.\n",
        )
    files[f"overlays/stack/{CONSOLE_NAME}.yaml"] = dump(
        console_objects(specs),
        f"#\n# The web console (issue 21, docs/console.md): HTTPS on {CONSOLE_PORT}, its "
        f"certificate: Secret {CONSOLE_NAME}-tls\n# naming {console_principal().uri}. "
        f"Open it with `kubectl -n {NAMESPACE} port-forward svc/{CONSOLE_NAME} "
        f"{CONSOLE_PORT}` and\n# https://127.0.0.1:{CONSOLE_PORT}/; viewers sign in with "
        "a bearer token.\n",
    )
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": [
            "../../base",
            "namespace.yaml",
            *(f"{s.name}.yaml" for s in specs),
            f"{CONSOLE_NAME}.yaml",
        ],
        "images": [{"name": IMAGE, "newTag": _version()}],
    }
    files["overlays/stack/kustomization.yaml"] = dump(
        [kustomization],
        "#\n# The local stack's topology (`lightpath up`) on Kubernetes:\n"
        "#   kubectl apply -k deploy/kubernetes/overlays/stack\n"
        "# after making its Secrets (docs/operations.md). Set `images` to your registry.\n",
    ).replace("---\n", "", 1)
    return files


def monitoring_files() -> dict[str, str]:
    """deploy/kubernetes/monitoring/: prometheus-operator objects scraping every pod."""
    part_of = {"app.kubernetes.io/part-of": PART_OF}
    metrics_labels = {**part_of, "lightpath.io/metrics": "true"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "lightpath-metrics", "labels": metrics_labels},
        "spec": {
            # headless: one endpoint per pod, each scraped on its own
            "clusterIP": "None",
            "selector": part_of,
            "ports": [
                {
                    "name": "metrics",
                    "port": METRICS_PORT,
                    "targetPort": METRICS_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }
    relabel = [
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_lightpath_io_process"],
            "targetLabel": "process",
        },
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "targetLabel": "service",
        },
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod_name"},
    ]
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "lightpath", "labels": part_of},
        "spec": {
            "jobLabel": "app.kubernetes.io/part-of",
            "selector": {"matchLabels": {"lightpath.io/metrics": "true"}},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": "15s",
                    "scheme": "http",
                    # Lightpath's own `pod` label (the superpod) wins over the target's
                    # (the Kubernetes pod, kept as pod_name below).
                    "honorLabels": True,
                    "relabelings": relabel,
                }
            ],
        },
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "lightpath-metrics-ingress", "labels": part_of},
        "spec": {
            "podSelector": {"matchLabels": part_of},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}
                            },
                            "podSelector": {"matchLabels": PROMETHEUS_POD_LABELS},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                }
            ],
        },
    }
    alerts = yaml.safe_load((ROOT / "deploy" / "monitoring" / "alerts.yml").read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "lightpath", "labels": part_of},
        "spec": {"groups": alerts["groups"]},
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": ["service.yaml", "servicemonitor.yaml", "network.yaml", "rules.yaml"],
    }
    return {
        "monitoring/kustomization.yaml": dump(
            [kustomization],
            "#\n# Prometheus (prometheus-operator, e.g. kube-prometheus-stack) scraping every\n"
            "# Lightpath pod on port 9464, and the alert rules of deploy/monitoring/alerts.yml:\n"
            "#   kubectl apply -k deploy/kubernetes/monitoring\n"
            "# Your Prometheus must select this ServiceMonitor and PrometheusRule (its\n"
            "# serviceMonitorSelector / ruleSelector; kube-prometheus-stack wants a\n"
            "# `release: <name>` label) and run in namespace monitoring (network.yaml).\n",
        ).replace("---\n", "", 1),
        "monitoring/service.yaml": dump([service]),
        "monitoring/servicemonitor.yaml": dump([monitor]),
        "monitoring/network.yaml": dump(
            [policy],
            "#\n# Lets Prometheus (namespace monitoring, app.kubernetes.io/name: prometheus) reach\n"
            "# the metrics port of every Lightpath pod; the default deny (base) shuts out the rest.\n",
        ),
        "monitoring/rules.yaml": dump(
            [rule],
            "#\n# deploy/monitoring/alerts.yml as a PrometheusRule (docs/operations.md says what\n"
            "# each alert means and what to check first).\n",
        ),
    }


def _version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def files() -> dict[str, str]:
    """Every file under deploy/kubernetes/, relative path -> text."""
    specs = deployed_topology()
    return {**base_files(), **overlay_files(specs), **monitoring_files()}


# -- a Kustomize subset, for tests and machines without kubectl -----------------

CLUSTER_SCOPED = {"Namespace"}
_KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images"}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` prints, for the features used here
    (resources, namespace, images); anything else is refused rather than ignored."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields this renderer does not do: {unknown}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    for image in kustomization.get("images", []):
        for obj in objects:
            pod = obj.get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise ValueError(f"{directory}: {key} is defined twice")
        seen.add(key)
    return objects


# -- the image's lock file -----------------------------------------------------


def runtime_lock() -> str:
    """Exact versions, from this environment, of every package the runtime needs:
    [project.dependencies] and what they require, without extras or dev tools."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pending = [Requirement(d) for d in deps]
    pinned: dict[str, str] = {}
    while pending:
        req = pending.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in pinned:
            continue
        dist = md.distribution(req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{req.name} {dist.version} does not satisfy {req}: reinstall .venv")
        pinned[name] = dist.version
        pending.extend(Requirement(r) for r in dist.requires or [])
    lines = [
        "# Every package the Lightpath image runs, at exact versions (deploy/Dockerfile",
        "# installs these with --no-deps, then checks them with `pip check`).",
        "# Written by `python scripts/gen_kubernetes.py --lock` from .venv; run it after",
        "# changing [project.dependencies]. tests/test_kubernetes.py checks it.",
        f"# python: {sys.version_info.major}.{sys.version_info.minor} {sys.platform}"
        " (markers were evaluated for this; the image's base must match)",
        *(f"{n}=={v}" for n, v in sorted(pinned.items())),
    ]
    return "\n".join(lines) + "\n"


def secret_commands(directory: str) -> str:
    """The `kubectl create secret` commands for the files scripts/compose_secrets.py makes
    in `directory` (names only: the values stay in the files)."""
    from lightpath.security.pki import file_stem

    ns = f"kubectl -n {NAMESPACE} create secret"
    lines = [
        f"kubectl create namespace {NAMESPACE}  # or apply the overlay's namespace.yaml first",
        f"{ns} generic {CA_SECRET} --from-file=ca.crt={directory}/ca.crt",
        f"{ns} generic {REDIS_SECRET} --from-file=password={directory}/redis.password",
    ]
    for s in deployed_topology():
        stem = f"{directory}/{file_stem(s.principal)}"
        lines.append(f"{ns} tls {tls_secret(s)} --cert={stem}.crt --key={stem}.key")
    stem = f"{directory}/{file_stem(console_principal())}"
    lines.append(f"{ns} tls {CONSOLE_NAME}-tls --cert={stem}.crt --key={stem}.key")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", action="store_true", help="print the built overlay")
    parser.add_argument("--lock", action="store_true", help="write deploy/requirements.lock")
    parser.add_argument(
        "--secret-commands",
        metavar="DIR",
        help="print the kubectl commands that make the Secrets from compose_secrets.py's DIR",
    )
    args = parser.parse_args(argv)
    if args.secret_commands:
        print(secret_commands(args.secret_commands.rstrip("/")), end="")
        return 0
    if args.render:
        objects = render(OUT / "overlays" / "stack")
        print("---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects), end="")
        return 0
    if args.lock:
        LOCK.write_text(runtime_lock())
        print(f"wrote {LOCK.relative_to(ROOT)}")
        return 0
    written = files()
    for old in OUT.rglob("*.yaml"):
        if str(old.relative_to(OUT)) not in written:
            old.unlink()
    for rel, text in written.items():
        path = OUT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(written)} files under {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
