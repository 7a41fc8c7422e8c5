"""Fleet-scale figures (issue 34): `dra-controller explain` / `simulate` at 100 to 5,000 nodes
beside the JSON-parse floor, and simulate's claims/s beside the real kube-scheduler's pods/s."""
