"""Shared pytest configuration: fixtures that start real Kubernetes components."""

pytest_plugins = ["tests.kube.fixtures"]
