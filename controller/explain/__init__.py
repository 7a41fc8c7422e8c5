"""`dra-controller explain`: why a claim or a pod's claims cannot be allocated, filter by filter."""
