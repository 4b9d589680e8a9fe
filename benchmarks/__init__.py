"""Benchmarks: run with ``python -m benchmarks.<name>``; each prints one JSON line last."""
