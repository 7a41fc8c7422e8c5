"""What kube-scheduler would decide for a pod: its claims, the allocator, Filter across nodes, Score."""
