"""Pods of the local workload image that hold one claim: the shape every end-to-end test writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def claim_pod(
    name: str,
    image: str,
    claim_source: Mapping[str, str],
    *,
    claim: str = "gpu",
    containers: Sequence[str] = ("app",),
    command: Sequence[str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Pod whose containers (all of `image`, never pulled) use pod claim `claim`.

    `claim_source` is `{"resourceClaimName": ...}` or `{"resourceClaimTemplateName": ...}`;
    `spec` adds pod fields (restartPolicy, nodeSelector, ...) as the test needs them."""
    container: dict[str, Any] = {"image": image, "imagePullPolicy": "Never"}
    if command is not None:
        container["command"] = list(command)
    container["resources"] = {"claims": [{"name": claim}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **spec,
            "resourceClaims": [{"name": claim, **claim_source}],
            "containers": [{"name": c, **container} for c in containers],
        },
    }
