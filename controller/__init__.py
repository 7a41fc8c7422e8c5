"""The cluster side of the GPU DRA driver: CEL, allocation, the scheduler model, and the commands."""
