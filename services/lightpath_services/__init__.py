"""Lightpath's five gRPC services; `python -m services.<name>` runs one."""
