"""`make gpu-check`: discovery, CDI specs, containers and sharing against the NVIDIA driver's own tools."""
