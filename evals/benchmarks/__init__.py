"""Benchmarks that write docs/benchmarks.md and docs/results/ (`make bench`, the peers, the front doors)."""
