"""tests/integration."""
