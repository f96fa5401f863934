"""`python -m lightpath_services.console` (`lightpath-console`): the web console over HTTPS.

Reads its settings (services/lightpath_services/console/settings.py; `--help` lists them), refuses to start
without a certificate (it serves HTTPS only), and serves until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from lightpath.startup import imports_without_gc

with imports_without_gc():
    import uvicorn

    from lightpath.security.credentials import Credentials, CredentialsError
    from lightpath.telemetry import configure_metrics, configure_tracing, serve_metrics
    from lightpath_services.common.settings import SettingsError, describe, load
    from lightpath_services.common.supervisor import Supervisor
    from lightpath_services.common.telemetry import configure_logging
    from lightpath_services.common.tls import is_loopback
    from lightpath_services.console.app import Console, build_app
    from lightpath_services.console.backends import Backends
    from lightpath_services.console.hub import Hub
    from lightpath_services.console.sessions import Sessions
    from lightpath_services.console.settings import ConsoleSettings

log = logging.getLogger("lightpath.console")


def build(settings: ConsoleSettings) -> tuple[Console, uvicorn.Config]:
    if not (settings.tls_cert and settings.tls_key and settings.tls_ca):
        raise SettingsError(
            "LIGHTPATH_TLS_CERT, LIGHTPATH_TLS_KEY and LIGHTPATH_TLS_CA are required: the "
            "console serves HTTPS with its own certificate and calls the services with it"
        )
    creds = Credentials.from_files(
        settings.tls_ca, settings.tls_cert, settings.tls_key, source="LIGHTPATH_TLS_*"
    )
    backends = Backends(
        creds,
        cell=settings.cell_addr,
        ocs=dict(settings.ocs_addrs),
        core_broker=settings.core_broker_addr,
        agg=dict(settings.agg_addrs),
        agg_tree=settings.agg_tree,
    )
    supervisor = Supervisor(log)
    console = Console(
        backends=backends,
        hub=Hub(backends, supervisor, settings.poll_s),
        sessions=Sessions(settings.session_ttl_s),
        supervisor=supervisor,
        anonymous_reads=settings.anonymous_reads(),
    )
    host, _, port = settings.listen.rpartition(":")
    config = uvicorn.Config(
        build_app(console),
        host=host.strip("[]"),
        port=int(port),
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=2,
        server_header=False,
    )
    return console, config


async def serve(settings: ConsoleSettings) -> None:
    console, config = build(settings)
    if settings.metrics_listen:
        # Its supervised watches (lightpath.task.down / restarts) and the process: what
        # LightpathConsoleDown and LightpathConsoleStale read.
        endpoint = serve_metrics(settings.metrics_listen)
        configure_metrics("lightpath-console", instance_id=settings.instance_id, prometheus=True)
        log.info("console metrics on %s", endpoint.url, extra={"metrics_url": endpoint.url})
    server = uvicorn.Server(config)
    log.info(
        "console serving https://%s (viewers without sign-in: %s)",
        settings.listen,
        "read-only view" if console.anonymous_reads else "sign-in page only",
        extra={"listen": settings.listen, "loopback": is_loopback(settings.listen)},
    )
    await server.serve()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in {"-h", "--help"}:
        print(__doc__)
        for d in describe(ConsoleSettings):
            print(f"  {d.env} (default {d.default})\n      {d.doc}")
        return 0
    try:
        settings = load(ConsoleSettings)
    except SettingsError as exc:
        print(f"lightpath-console: {exc}", file=sys.stderr)
        return 2
    configure_logging("console", settings.instance_id, settings.log_level, settings.log_format)
    configure_tracing("lightpath-console", instance_id=settings.instance_id)
    try:
        asyncio.run(serve(settings))
    except (SettingsError, CredentialsError) as exc:
        print(f"lightpath-console: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
