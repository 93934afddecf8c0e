"""Benchmarks that compare methods end to end (see e2e.py)."""
