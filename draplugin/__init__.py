"""The node side of the GPU DRA driver: the kubelet plugin."""
