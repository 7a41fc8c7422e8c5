"""Allocation throughput benchmark (`python -m bench.allocate`)."""
