"""lint's sharing-conflict: allocated claims whose sharing mechanisms prepare refuses to mix on one
GPU (draplugin.prepare.sharing), and a claim's MPS shares on several GPUs."""

from __future__ import annotations

from typing import Any

from controller.lint.linter import lint
from controller.objects import ClusterObjects

D = "gpu.draplugin.dev"


def allocated(name: str, *results: dict[str, Any], strategy: str | None = None) -> dict[str, Any]:
    configs = []
    if strategy is not None:
        parameters = {"apiVersion": f"{D}/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": strategy}}
        configs.append(
            {"source": "FromClaim", "requests": [], "opaque": {"driver": D, "parameters": parameters}}
        )
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": list(results), "config": configs}}},
    }


def share(device: str, share_id: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": D, "pool": "n", "device": device}
    if share_id is not None:
        result["shareID"] = share_id
    return result


def conflicts(*claims: dict[str, Any]) -> list[str]:
    report = lint(ClusterObjects(claims=list(claims)))
    return [f"{f.object} {f.where}: {f.message}" for f in report.findings if f.code == "sharing-conflict"]


def test_two_mps_shares_of_one_gpu_are_fine() -> None:
    assert conflicts(allocated("a", share("gpu-0", "s1")), allocated("b", share("gpu-0", "s2"))) == []


def test_an_mps_share_next_to_a_time_sliced_share_is_an_error() -> None:
    (finding,) = conflicts(
        allocated("a", share("gpu-0", "s1")), allocated("b", share("gpu-0", "s2"), strategy="TimeSlicing")
    )
    assert finding.startswith("ResourceClaim/ns/b device n/gpu-0 of gpu.draplugin.dev")
    assert "MPS shares and TimeSlicing cannot meet on one GPU" in finding


def test_time_sliced_shares_together_are_fine_and_a_holder_without_a_share_is_not() -> None:
    sliced = [allocated(n, share("gpu-0", n), strategy="TimeSlicing") for n in ("a", "b")]
    assert conflicts(*sliced) == []
    (finding,) = conflicts(allocated("a", share("gpu-0", "s1")), allocated("c", share("gpu-0", None)))
    assert "without a share (exclusively)" in finding


def test_mps_shares_of_two_gpus_in_one_claim_are_an_error() -> None:
    (finding,) = conflicts(allocated("a", share("gpu-0", "s1"), share("gpu-1", "s2")))
    assert "MPS shares of 2 GPUs (n/gpu-0, n/gpu-1)" in finding
