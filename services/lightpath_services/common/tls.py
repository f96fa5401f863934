"""Transport security of a service: TLS server credentials (rotated without a
restart), its own client credentials for calls to peers, and the rule that a
plaintext service binds loopback only."""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

import grpc

from lightpath.security.credentials import Credentials, CredentialsError
from lightpath_services.common.settings import CommonSettings

log = logging.getLogger("lightpath.tls")


class TransportError(RuntimeError):
    """A transport setting that cannot work; the message names the setting."""


def is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(settings: CommonSettings) -> None:
    """Refuse a configuration that would serve in the clear beyond loopback, or half of TLS."""
    files = (settings.tls_cert, settings.tls_key)
    if settings.plaintext:
        if not is_loopback(settings.listen):
            raise TransportError(
                f"LIGHTPATH_PLAINTEXT=true serves without TLS, so it binds loopback only; "
                f"LIGHTPATH_LISTEN={settings.listen} is not loopback (use 127.0.0.1:PORT, or set "
                "LIGHTPATH_TLS_CERT/KEY/CA)"
            )
        return
    if not all(files):
        raise TransportError(
            "TLS is on by default: set LIGHTPATH_TLS_CERT and LIGHTPATH_TLS_KEY (and LIGHTPATH_TLS_CA "
            "for client certificates), or LIGHTPATH_PLAINTEXT=true for a loopback-only plaintext service"
        )
    if settings.tls_client_auth == "require" and not settings.tls_ca:
        raise TransportError(
            "LIGHTPATH_TLS_CLIENT_AUTH=require needs LIGHTPATH_TLS_CA, the CA that issues client certificates"
        )
    for var, path in (
        ("LIGHTPATH_TLS_CERT", settings.tls_cert),
        ("LIGHTPATH_TLS_KEY", settings.tls_key),
        ("LIGHTPATH_TLS_CA", settings.tls_ca),
    ):
        if path and not os.access(path, os.R_OK):
            raise TransportError(f"{var}={path} cannot be read")


def _mtimes(paths: list[str]) -> tuple[float, ...]:
    out = []
    for p in paths:
        try:
            out.append(os.stat(p).st_mtime)
        except OSError:
            out.append(-1.0)
    return tuple(out)


def server_credentials(settings: CommonSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' files, None for plaintext. The files are
    read again at the next handshake after any of them changes (rotation without
    restart); a half-written or broken set keeps the old one and is logged."""
    if settings.plaintext:
        return None
    paths = [p for p in (settings.tls_cert, settings.tls_key, settings.tls_ca) if p]
    require = settings.tls_client_auth == "require"

    def load() -> grpc.ServerCertificateConfiguration:
        key = Path(settings.tls_key).read_bytes()
        cert = Path(settings.tls_cert).read_bytes()
        ca = Path(settings.tls_ca).read_bytes() if settings.tls_ca else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    seen = {"mtimes": _mtimes(paths)}
    initial = load()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        now = _mtimes(paths)
        if now == seen["mtimes"]:
            return None
        try:
            config = load()
        except (OSError, ValueError) as exc:
            log.error(
                "certificate files changed but cannot be loaded; keeping the old ones: %s", exc
            )
            return None
        seen["mtimes"] = now
        log.info(
            "certificate files changed: new handshakes use them", extra={"files": ",".join(paths)}
        )
        return config

    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=require
    )


def client_credentials(settings: CommonSettings) -> Credentials:
    """What this service presents on calls to its peers: its own certificate (mTLS)
    and/or its token (LIGHTPATH_TOKEN_FILE)."""
    token = ""
    if settings.token_file:
        try:
            token = Path(settings.token_file).read_text().strip()
        except OSError as exc:
            raise TransportError(
                f"LIGHTPATH_TOKEN_FILE={settings.token_file} cannot be read: {exc.strerror}"
            ) from None
    if settings.plaintext:
        return Credentials(token=token, source="plaintext")
    try:
        return Credentials.from_files(
            settings.tls_ca or None,
            settings.tls_cert or None,
            settings.tls_key or None,
            token=token,
            source="service settings",
        )
    except CredentialsError as exc:
        raise TransportError(str(exc)) from None
