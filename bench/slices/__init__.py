"""Benchmark: publishing 1,024 devices as ResourceSlices, and API writes while idle."""
