"""The core broker's fixtures, for the graph RPCs' contract tests."""

from tests.core_broker.conftest import broker, open_broker  # noqa: F401 - pytest fixtures
