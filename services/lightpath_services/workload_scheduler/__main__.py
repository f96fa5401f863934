"""`python -m lightpath_services.workload_scheduler` (console script `lightpath-workload-scheduler`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.common.server import main as serve
    from lightpath_services.workload_scheduler.server import build
    from lightpath_services.workload_scheduler.settings import WorkloadSchedulerSettings


def main() -> None:
    serve("workload_scheduler", WorkloadSchedulerSettings, build)


if __name__ == "__main__":
    main()
