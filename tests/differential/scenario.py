"""One differential scenario: a pod and everything its scheduling depends on, as API objects.

Each scenario owns its names: its nodes carry its tag as a label the pod selects, its devices
belong to a driver named after the tag, and its classes select that driver only. So thousands
play at once in one cluster without seeing each other, and `retagged` makes a copy that can be
played beside the original (the shrinker plays many variants at once).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any

JSON = dict[str, Any]

SCENARIO_LABEL = "diff.draplugin.dev/scenario"  # on nodes, slices, classes: which scenario owns them
POD_CLAIM_PREFIX = "c"


@dataclass
class Scenario:
    tag: str  # DNS-label safe, fixed width: no tag is a prefix of another
    minor: int  # the Kubernetes minor release it was generated for
    nodes: list[str]
    slices: list[JSON]
    classes: list[JSON]
    claims: list[JSON]  # the pod's claims, in the pod's order (namespace filled in when played)
    blockers: list[JSON] = field(default_factory=list)  # earlier claims, with status.allocation

    @property
    def driver(self) -> str:
        return driver_name(self.tag)

    def pod(self, namespace: str) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{self.tag}-pod", "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "nodeSelector": {SCENARIO_LABEL: self.tag},
                "resourceClaims": [
                    {"name": name, "resourceClaimName": c["metadata"]["name"]}
                    for name, c in zip(self.pod_claim_names(), self.claims, strict=True)
                ],
                "containers": [{
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": name} for name in self.pod_claim_names()]},
                }],
            },
        }  # fmt: skip

    def pod_claim_names(self) -> list[str]:
        return [f"{POD_CLAIM_PREFIX}{i}" for i in range(len(self.claims))]

    def in_namespace(self, objects: list[JSON], namespace: str) -> list[JSON]:
        copies = copy.deepcopy(objects)
        for obj in copies:
            obj["metadata"]["namespace"] = namespace
        return copies

    def node_labels(self) -> dict[str, str]:
        return {SCENARIO_LABEL: self.tag}

    def retagged(self, tag: str) -> Scenario:
        """The same scenario under another tag (every name that carries the tag follows)."""
        text = json.dumps(asdict(self)).replace(self.tag, tag)
        return Scenario.from_json(json.loads(text))

    def to_json(self) -> JSON:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JSON) -> Scenario:
        return cls(**data)

    def size(self) -> int:
        """How much there is to shrink: nodes, slices, devices, claims, requests, blockers."""
        devices = sum(len(s["spec"].get("devices") or []) for s in self.slices)
        requests = sum(len(c["spec"]["devices"]["requests"]) for c in self.claims)
        return len(self.nodes) + len(self.slices) + devices + len(self.claims) + requests + len(self.blockers)


def driver_name(tag: str) -> str:
    return f"{tag}.diff.draplugin.dev"
