"""Checking a Lightpath deployment from outside, for tests and benchmarks (issue 32)."""
