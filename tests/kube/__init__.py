"""Real Kubernetes components for tests and the demo: process control, cluster, kubelet."""
