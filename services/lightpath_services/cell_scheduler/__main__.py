"""`python -m lightpath_services.cell_scheduler` (console script `lightpath-cell-scheduler`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.cell_scheduler.server import build
    from lightpath_services.cell_scheduler.settings import CellSchedulerSettings
    from lightpath_services.common.server import main as serve


def main() -> None:
    serve("cell_scheduler", CellSchedulerSettings, build)


if __name__ == "__main__":
    main()
