"""Shared server runtime: settings, Redis, telemetry, errors, the server factory."""
