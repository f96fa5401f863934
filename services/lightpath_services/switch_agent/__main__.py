"""`python -m lightpath_services.switch_agent` (console script `lightpath-switch-agent`)."""

from lightpath.startup import imports_without_gc

with imports_without_gc():
    from lightpath_services.common.server import main as serve
    from lightpath_services.switch_agent.server import build
    from lightpath_services.switch_agent.settings import SwitchAgentSettings


def main() -> None:
    serve("switch_agent", SwitchAgentSettings, build)


if __name__ == "__main__":
    main()
