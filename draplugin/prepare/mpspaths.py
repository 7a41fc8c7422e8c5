"""Where a claim's MPS directories lie, apart from `mps` and `plan` so that both import them.

On the host the claim's directory is `<state>/mps/<claim uid>` with `pipe/`,
`log/` and `shm/` in it (`draplugin.prepare.mps` makes them); its containers
get it at `MPS_CONTAINER_DIR` and its `shm/` as their `/dev/shm`
(`draplugin.prepare.plan` writes the CDI mounts). No imports: `make gpu-check`
loads this without pydantic.
"""

from __future__ import annotations

# Where the claim's containers see the claim's MPS directory (its pipe/ and log/).
MPS_CONTAINER_DIR = "/var/run/draplugin/mps"
# The claim's shared-memory directory, next to pipe/ and log/, and where the daemon and the claim's
# containers see it.
SHM_DIR = "shm"
SHM_CONTAINER_PATH = "/dev/shm"
