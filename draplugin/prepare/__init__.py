"""Preparing claims: pure planning, API access, sharing state, and the wiring that joins them."""
