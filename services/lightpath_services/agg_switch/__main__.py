"""`python -m lightpath_services.agg_switch` (console script `lightpath-agg-switch`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.agg_switch.server import build
    from lightpath_services.agg_switch.settings import AggSwitchSettings
    from lightpath_services.common.server import main as serve


def main() -> None:
    serve("agg_switch", AggSwitchSettings, build)


if __name__ == "__main__":
    main()
