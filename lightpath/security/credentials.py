"""What a client presents: TLS roots, a client certificate and key, a bearer token.

    creds = Credentials.default()            # what the CLI and SDK use
    creds = Credentials.default("tenant:acme")
    ch = lightpath.client.channel(address, credentials=creds)

`default()` looks, in order, at:
  1. LIGHTPATH_PLAINTEXT=true: no TLS (a token may still be sent);
  2. an identity asked for (or LIGHTPATH_IDENTITY): the local stack's
     certificate of it (`<state dir>/pki`, made by `lightpath up`);
  3. LIGHTPATH_TLS_CA (+ LIGHTPATH_TLS_CERT / LIGHTPATH_TLS_KEY): your own PKI;
  4. the context in use (lightpath.config: `--context`, LIGHTPATH_CONTEXT, the config
     file's current_context), when it names credentials: its tls_* and token_file;
  5. the local stack's operator certificate;
  6. nothing: TLS trusting the system's roots, with no client certificate
     (a token, if set, names the caller). Plaintext is never a fallback.
A bearer token comes from LIGHTPATH_TOKEN_FILE (a file holding it) or
LIGHTPATH_TOKEN, and is sent as `authorization: Bearer <token>` on every call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from lightpath.paths import default_state_dir, pki_dir
from lightpath.security.identity import OPERATOR, TENANT, IdentityError, Principal, from_uri


class CredentialsError(RuntimeError):
    """No usable credential; the message says what to do."""


def _truthy(raw: str) -> bool:
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def identity_of(text: str) -> Principal:
    """`operator`, `tenant:acme`, `acme` (a tenant), `service:cell_scheduler`, ..."""
    if ":" not in text:
        return Principal(OPERATOR, OPERATOR) if text == OPERATOR else Principal(TENANT, text)
    return Principal.parse(text)


@dataclass(frozen=True)
class Credentials:
    """`tls` False means plaintext; `ca` None (with TLS) trusts the system's roots;
    `cert`/`key` None means no client certificate."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    token: str = ""
    source: str = "none"  # for messages: where these came from
    tls: bool = False

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def certificate_principal(self) -> Principal | None:
        """The `spiffe://lightpath/...` principal of the client certificate, None without one."""
        if not self.cert:
            return None
        from cryptography import x509

        try:
            cert = x509.load_pem_x509_certificate(self.cert)
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (ValueError, x509.ExtensionNotFound):
            return None
        for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
            principal = from_uri(uri)
            if principal is not None:
                return principal
        return None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def with_token(self, token: str) -> Credentials:
        return Credentials(self.ca, self.cert, self.key, token, self.source, self.tls)

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        *,
        token: str = "",
        source: str = "files",
    ) -> Credentials:
        def read(p: str | Path | None, what: str) -> bytes | None:
            if not p:
                return None
            try:
                return Path(p).read_bytes()
            except OSError as exc:
                raise CredentialsError(f"cannot read the {what} {p}: {exc.strerror}") from None

        if bool(cert) != bool(key):
            raise CredentialsError("a client certificate needs its key, and a key its certificate")
        return cls(
            read(ca, "CA certificate"),
            read(cert, "certificate"),
            read(key, "key"),
            token,
            source,
            True,
        )

    @classmethod
    def local(
        cls,
        principal: Principal,
        state_dir: Path | None = None,
        *,
        token: str = "",
        tls: bool | None = None,
    ) -> Credentials:
        """The local stack's certificate of `principal` (made by `lightpath up` / `tenant
        create`); on a plaintext stack (`tls` False, or its stack.json says so) its token."""
        if tls is None:
            tls = _stack_uses_tls(state_dir)
        if not tls:
            path = token_path(state_dir, principal)
            try:
                own = path.read_text().strip()
            except OSError:
                raise CredentialsError(
                    f"no local token for {principal} in {path}: this stack runs plaintext; "
                    f"`lightpath tenant create {principal.name} --token` issues one"
                ) from None
            return cls(token=token or own, source=f"local {principal} (token)")
        # pki (the cryptography package's x509, ~30 ms) only when a local stack's
        # certificate is read: a service's or a client's start path does not need it
        from lightpath.security.pki import LocalCA

        ca = LocalCA(pki_dir(state_dir))
        if not ca.cert_path.exists():
            raise CredentialsError(
                f"no local certificates in {ca.dir}: start the stack with `lightpath up` first"
            )
        files = ca.paths(principal)
        if not files.cert.exists():
            hint = (
                f"run `lightpath tenant create {principal.name}`"
                if principal.kind == TENANT
                else "restart `lightpath up` to issue it"
            )
            raise CredentialsError(f"no local credential for {principal}: {hint}")
        return cls.from_files(
            files.ca, files.cert, files.key, token=token, source=f"local {principal}"
        )

    @classmethod
    def default(
        cls,
        identity: str | None = None,
        *,
        state_dir: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Credentials:
        env = os.environ if environ is None else environ
        token = _token_from(env)
        if _truthy(env.get("LIGHTPATH_PLAINTEXT", "")):
            return cls(token=token, source="plaintext (LIGHTPATH_PLAINTEXT)")
        identity = identity or env.get("LIGHTPATH_IDENTITY") or None
        if env.get("LIGHTPATH_TLS_CA") and identity is None:
            return cls.from_files(
                env["LIGHTPATH_TLS_CA"],
                env.get("LIGHTPATH_TLS_CERT") or None,
                env.get("LIGHTPATH_TLS_KEY") or None,
                token=token,
                source="LIGHTPATH_TLS_*",
            )
        if identity is None:
            from_context = cls._from_context(env, token)
            if from_context is not None:
                return from_context
        chosen = identity or ""
        if chosen or (pki_dir(state_dir) / "ca.crt").exists():
            try:
                principal = identity_of(chosen or OPERATOR)
            except IdentityError as exc:
                raise CredentialsError(f"bad identity {chosen!r}: {exc}") from None
            return cls.local(principal, state_dir, token=token)
        # Nothing configured: still TLS (the system's roots, no client certificate);
        # plaintext only ever by LIGHTPATH_PLAINTEXT.
        return cls(token=token, source="none", tls=True)

    @classmethod
    def _from_context(cls, env: Mapping[str, str], token: str) -> Credentials | None:
        from lightpath.config import ConfigError, current_context

        try:
            context = current_context(env)
        except ConfigError as exc:
            raise CredentialsError(str(exc)) from None
        if context is None or not context.has_credentials:
            return None
        if not token and context.token_file:
            try:
                token = Path(context.token_file).read_text().strip()
            except OSError as exc:
                raise CredentialsError(
                    f"cannot read context {context.name}'s token_file {context.token_file}: "
                    f"{exc.strerror}"
                ) from None
        creds = cls.from_files(
            context.tls_ca or None,
            context.tls_cert or None,
            context.tls_key or None,
            token=token,
            source=f"context {context.name}",
        )
        return creds


def token_path(state_dir: Path | None, principal: Principal) -> Path:
    """Where the local stack keeps `principal`'s bearer token (0600, beside its certificate)."""
    from lightpath.security.pki import file_stem

    return pki_dir(state_dir) / f"{file_stem(principal)}.token"


def _stack_uses_tls(state_dir: Path | None) -> bool:
    import json

    try:
        data = json.loads(((state_dir or default_state_dir()) / "stack.json").read_text())
    except (OSError, ValueError):
        return True
    return bool(data.get("tls", True))


def _token_from(env: Mapping[str, str]) -> str:
    path = env.get("LIGHTPATH_TOKEN_FILE", "")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise CredentialsError(
                f"cannot read LIGHTPATH_TOKEN_FILE {path}: {exc.strerror}"
            ) from None
    return env.get("LIGHTPATH_TOKEN", "").strip()
