"""Who a caller is.

A principal is a kind and a name. It travels in a certificate as one URI
subject alternative name, `spiffe://lightpath/<kind>/<name>` (SPIFFE's form,
so a SPIRE or cert-manager CA can issue the same identities), or it is what a
bearer token was issued to.

Kinds:
  service    one Lightpath process; the name is the service and, for services
             that serve one superpod or one switch, its scope:
             `workload_scheduler/pod-1`, `ocs_manager/pod-1`, `agg_switch/root`,
             `cell_scheduler`, `core_broker`; `console` is the web console,
             which may only read (a read-only operator).
  operator   a person or tool that runs the cell (`operator`, `alice`, ...).
  tenant     a job system acting for one tenant; the name is the tenant, never one
             of RESERVED_TENANTS (`default` is what has no tenant: the operators').
  application  a core_broker application (its id).
  node       a compute node of an aggregation tree (its node id).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

TRUST_DOMAIN = "lightpath"

SERVICE = "service"
OPERATOR = "operator"
TENANT = "tenant"
APPLICATION = "application"
NODE = "node"
KINDS = (SERVICE, OPERATOR, TENANT, APPLICATION, NODE)

# One name segment: what Lightpath ids allow (lightpath_services.common.keys), so a
# principal's name can be a tenant, pod, node or application id as it is.
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# The tenant of what is submitted without one (a job, an aggregation command): it
# belongs to the operators, so no tenant may ever be called that.
NO_TENANT = "default"
# Tenant names no credential can carry (compared without regard to case): the name
# of what has no tenant, and names that read as the system's own. A certificate
# or token for one of them authenticates nobody, and none can be issued.
RESERVED_TENANTS = frozenset(
    {
        NO_TENANT,
        "admin",
        "all",
        "anonymous",
        "any",
        "cell",
        "console",
        "lightpath",
        "none",
        "operator",
        "operators",
        "root",
        "service",
        "system",
        "unknown",
    }
)


def is_reserved_tenant(name: str) -> bool:
    return name.lower() in RESERVED_TENANTS


class IdentityError(ValueError):
    """A kind or name that cannot be an identity; the message says the rule."""


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str
    name: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise IdentityError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        parts = self.name.split("/")
        if not 1 <= len(parts) <= 2 or not all(_SEGMENT.match(p) for p in parts):
            raise IdentityError(
                f"name {self.name!r} must be one or two `/`-separated ids "
                "(1-64 characters of A-Z a-z 0-9 . _ - each)"
            )
        if self.kind == TENANT and is_reserved_tenant(self.name):
            raise IdentityError(
                f"tenant name {self.name!r} is reserved (what is submitted without a tenant "
                f"is the operators'; reserved: {', '.join(sorted(RESERVED_TENANTS))})"
            )

    @property
    def uri(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/{self.kind}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    def is_service(self, service: str) -> bool:
        """A process of `service` (any scope)."""
        return self.kind == SERVICE and self.name.split("/")[0] == service

    def scope(self) -> str:
        """The pod or switch a service principal serves ('' for unscoped services)."""
        _, _, scope = self.name.partition("/")
        return scope

    @classmethod
    def parse(cls, text: str) -> Principal:
        """`kind:name` (what `str()` gives, what settings and the CLI take)."""
        kind, sep, name = text.partition(":")
        if not sep:
            raise IdentityError(f"{text!r} must look like kind:name, e.g. tenant:acme")
        return cls(kind, name)


def from_uri(uri: str) -> Principal | None:
    """The principal of a `spiffe://lightpath/<kind>/<name>` URI, None for any other URI."""
    prefix = f"spiffe://{TRUST_DOMAIN}/"
    if not uri.startswith(prefix):
        return None
    kind, sep, name = uri[len(prefix) :].partition("/")
    if not sep:
        return None
    try:
        return Principal(kind, name)
    except IdentityError:
        return None


def dns_name(principal: Principal) -> str:
    """The DNS name a certificate of `principal` carries besides its URI SAN, and the
    name a client checks the server's certificate against (gRPC verifies DNS SANs, not
    URIs): `service:ocs_manager/pod-1` → `ocs-manager.pod-1.<h>.service.lightpath`.

    Readable labels (lowercase, `_` and `.` as `-`) and `<h>`, 10 characters of the
    SHA-256 of the exact principal, so that names a DNS comparison would confuse
    (`Pod-1` and `pod-1`, `a_b` and `a-b`) never share one."""
    digest = hashlib.sha256(str(principal).encode()).digest()
    h = base64.b32encode(digest[:10]).decode().lower().rstrip("=")[:10]
    labels = [_dns_label(p) for p in principal.name.split("/")]
    return ".".join([*labels, h, principal.kind, TRUST_DOMAIN])


def _dns_label(segment: str) -> str:
    label = re.sub(r"[^a-z0-9-]", "-", segment.lower()).strip("-")[:63].strip("-")
    return label or "x"


def service_principal(service: str, scope: str = "") -> Principal:
    return Principal(SERVICE, f"{service}/{scope}" if scope else service)


# The web console (services/lightpath_services/console, issue 21): a service identity, because it serves
# HTTPS with its certificate, whose policy rows are reads only (lightpath_services.common.policy):
# a read-only operator. A viewer who signs in has their own token forwarded instead.
CONSOLE_SERVICE = "console"


def console_principal() -> Principal:
    return service_principal(CONSOLE_SERVICE)
