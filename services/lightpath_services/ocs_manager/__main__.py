"""`python -m lightpath_services.ocs_manager` (console script `lightpath-ocs-manager`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.common.server import main as serve
    from lightpath_services.ocs_manager.server import build
    from lightpath_services.ocs_manager.settings import OcsManagerSettings


def main() -> None:
    serve("ocs_manager", OcsManagerSettings, build)


if __name__ == "__main__":
    main()
