"""The Kubernetes DRA CEL environment."""
