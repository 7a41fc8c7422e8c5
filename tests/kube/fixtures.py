"""Pytest fixtures that run real Kubernetes components (filled in by the real-cluster work)."""
