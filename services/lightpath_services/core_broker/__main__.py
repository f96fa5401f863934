"""`python -m lightpath_services.core_broker` (console script `lightpath-core-broker`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.common.server import main as serve
    from lightpath_services.core_broker.server import build
    from lightpath_services.core_broker.settings import CoreBrokerSettings


def main() -> None:
    serve("core_broker", CoreBrokerSettings, build)


if __name__ == "__main__":
    main()
