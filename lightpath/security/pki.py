"""A small certificate authority on disk, made with the `cryptography` package.

    ca = LocalCA(state_dir / "pki")
    ca.ensure()                                   # ca.crt + ca.key, once
    files = ca.issue(Principal("tenant", "acme")) # tenant-acme.crt/.key

Every certificate it issues carries its principal as the URI SAN
(`identity.Principal.uri`) and as a DNS SAN (`identity.dns_name`: the name a
Lightpath client checks its server against, so a certificate of another identity
fails the handshake), the loopback addresses and `localhost` (plus any `hosts`
asked for). A service's may serve and call (serverAuth + clientAuth):
one certificate is its server identity and its client identity on calls to its
peers; everyone else's may only call (clientAuth), so a tenant's or a node's
certificate cannot pose as a Lightpath server. Keys are ECDSA P-256 and written 0600; a certificate is issued
again when it is missing, unreadable, signed by another CA, lacks a host asked
for, or expires within 30 days.

Your own CA: hand each service its certificate, key and your CA's certificate
through LIGHTPATH_TLS_CERT / _KEY / _CA; nothing here is needed then.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lightpath.paths import write_private
from lightpath.security.identity import SERVICE, Principal, dns_name

LOOPBACK_IPS = ("127.0.0.1", "::1")
VALID_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class IssuedFiles:
    cert: Path
    key: Path
    ca: Path


def file_stem(principal: Principal) -> str:
    """`tenant:acme` → `tenant-acme`, `service:ocs_manager/pod-1` → `service-ocs_manager-pod-1`."""
    return f"{principal.kind}-{principal.name.replace('/', '-')}"


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class LocalCA:
    """A CA whose key and certificate live in `directory` (made 0700)."""

    def __init__(self, directory: Path, *, common_name: str = "Lightpath local CA"):
        self.dir = Path(directory)
        self.common_name = common_name

    @property
    def cert_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def key_path(self) -> Path:
        return self.dir / "ca.key"

    def exists(self) -> bool:
        return self.cert_path.exists() and self.key_path.exists()

    def ensure(self) -> LocalCA:
        """Create the CA on first use; an existing one is kept."""
        if self.exists():
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=10 * VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        write_private(self.key_path, _key_pem(key))
        _write_public(self.cert_path, cert.public_bytes(serialization.Encoding.PEM))
        return self

    def _load(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key

    def paths(self, principal: Principal) -> IssuedFiles:
        stem = file_stem(principal)
        return IssuedFiles(self.dir / f"{stem}.crt", self.dir / f"{stem}.key", self.cert_path)

    def issue(
        self,
        principal: Principal,
        *,
        hosts: tuple[str, ...] = (),
        days: int = VALID_DAYS,
        force: bool = False,
    ) -> IssuedFiles:
        """A certificate + key for `principal`, reused while still good (see module doc)."""
        self.ensure()
        files = self.paths(principal)
        if not force and self._still_good(files, principal, hosts):
            return files
        ca_cert, ca_key = self._load()
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(principal.uri),
            x509.DNSName(dns_name(principal)),
            x509.DNSName("localhost"),
        ]
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        sans.extend(x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(principal))]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_dedupe(sans)), critical=False)
            .add_extension(x509.ExtendedKeyUsage(_usages(principal)), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_private(files.key, _key_pem(key))
        _write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))
        return files

    def _still_good(self, files: IssuedFiles, principal: Principal, hosts: tuple[str, ...]) -> bool:
        try:
            cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
            if not files.key.exists():
                return False
            ca_cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            cert.verify_directly_issued_by(ca_cert)
        except (OSError, ValueError, TypeError, Exception):  # any doubt: issue again
            return False
        if cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < RENEW_BEFORE:
            return False
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return False
        if principal.uri not in sans.get_values_for_type(x509.UniformResourceIdentifier):
            return False
        have = set(sans.get_values_for_type(x509.DNSName)) | {
            str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
        }
        # Certificates issued before identity DNS names (issue 30) are issued again.
        return all(str(_normal_host(h)) in have for h in (dns_name(principal), *hosts))


def _usages(principal: Principal) -> list[x509.ObjectIdentifier]:
    """Services serve and call; everyone else only calls, so a tenant's or a node's
    certificate can never pose as a Lightpath server."""
    if principal.kind == SERVICE:
        return [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return [ExtendedKeyUsageOID.CLIENT_AUTH]


def _normal_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _dedupe(names: list[x509.GeneralName]) -> list[x509.GeneralName]:
    seen: set[x509.GeneralName] = set()
    out = []
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out
