"""A local Kubernetes cluster from real components built by tests/cluster/: process control,
control plane, kubelet, and the demo. A development tool run from a checkout, not shipped in the wheel."""
