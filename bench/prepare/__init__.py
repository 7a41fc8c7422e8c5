"""Prepare/unprepare latency and memory against a real API server."""
