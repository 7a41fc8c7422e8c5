"""Structured allocation internals: pools, requests, constraints, capacity, search, results."""
