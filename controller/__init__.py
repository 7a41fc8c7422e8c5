"""The cluster side of the GPU DRA driver: CEL, allocation, explain, lint."""
