"""The kubelet protocol layer: registration, DRA gRPC services, sockets. No device logic."""
