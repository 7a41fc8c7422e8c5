"""tests/unit."""
