"""A differential of `simulate` against the real kube-scheduler on random multi-node scenarios.

`scenario` (the data), `generator` (random scenarios per release), `compare` (what must agree),
`play` (both runs, many scenarios at once in one cluster), `shrink` (a disagreement reduced to a
minimal, ready-to-commit pytest case).
"""
