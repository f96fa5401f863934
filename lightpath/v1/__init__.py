"""Generated gRPC stubs of the lightpath.v1 API (scripts/gen_protos.py)."""
