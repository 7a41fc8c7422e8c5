"""Infrastructure shared by the node plugin and the controller: API access,
Kubernetes versions, logging, the CLI registry. Imports neither side."""
