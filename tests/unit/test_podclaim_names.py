"""Claims made from templates, named and found as kube-controller-manager and kube-scheduler do.

Expected names are worked out by hand from upstream's rule (pkg/controller/resourceclaim,
handleClaim, 1.34.4 and 1.37.2): generateName `<pod>-<podClaimName>-`; above 57 characters
both parts are cut to len*57//len(generateName) and joined by one hyphen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.builders import claim, device_class, exactly
from controller.cli import main
from controller.scheduler.podclaims import (
    ClaimIndex,
    claim_generate_name,
    is_generated_name,
    offline_claim_name,
    resolve_pod,
)

LONG_POD = "a" * 50
LONG_CLAIM = "gpu-claim-with-a-long-name"  # 26 characters: 50 + 1 + 26 + 1 = 78 > 57


def template(name: str = "gpu-template") -> dict[str, Any]:
    spec = claim("unused", [exactly("gpu", "gpu")])["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": spec},
    }


def pod(name: str, pod_claim: str, *, uid: str = "uid-1", statuses: Any = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "resourceClaims": [{"name": pod_claim, "resourceClaimTemplateName": "gpu-template"}],
        },
    }
    if statuses is not None:
        obj["status"] = {"resourceClaimStatuses": statuses}
    return obj


def owned_claim(name: str, pod_name: str, uid: str, pod_claim: str | None = None) -> dict[str, Any]:
    obj = claim(name, [exactly("gpu", "gpu")])
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid, "controller": True}
    ]
    if pod_claim is not None:
        obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim}
    return obj


# ----- the name rule ------------------------------------------------------------------------


def test_short_names_keep_the_trailing_hyphen() -> None:
    assert claim_generate_name("trainer", "gpu") == "trainer-gpu-"
    assert offline_claim_name("trainer", "gpu") == "trainer-gpu"


def test_exactly_57_characters_are_not_cut() -> None:
    pod_name, pod_claim = "p" * 30, "c" * 25  # 30 + 1 + 25 + 1 = 57
    assert claim_generate_name(pod_name, pod_claim) == "p" * 30 + "-" + "c" * 25 + "-"
    assert offline_claim_name(pod_name, pod_claim) == "p" * 30 + "-" + "c" * 25


def test_58_characters_cut_both_parts_and_drop_the_trailing_hyphen() -> None:
    # 31 * 57 // 58 = 30 and 25 * 57 // 58 = 24
    pod_name, pod_claim = "p" * 31, "c" * 25
    assert claim_generate_name(pod_name, pod_claim) == "p" * 30 + "-" + "c" * 24
    assert offline_claim_name(pod_name, pod_claim) == "p" * 30 + "-" + "c" * 24


def test_long_pod_name_keeps_part_of_the_claim_name() -> None:
    # 50 * 57 // 78 = 36 and 26 * 57 // 78 = 19
    expected = "a" * 36 + "-gpu-claim-with-a-lo"
    assert claim_generate_name(LONG_POD, LONG_CLAIM) == expected
    assert offline_claim_name(LONG_POD, LONG_CLAIM) == expected
    assert len(expected) + 5 <= 63


def test_very_long_pod_name_alone_is_cut() -> None:
    # A 253-character pod name and claim "gpu": 253 + 1 + 3 + 1 = 258; 253*57//258 = 55, 3*57//258 = 0.
    assert claim_generate_name("x" * 253, "gpu") == "x" * 55 + "-"


def test_generated_names_are_recognised() -> None:
    assert is_generated_name("trainer-gpu-b7x2q", "trainer-gpu-")
    assert not is_generated_name("trainer-gpu-b7x2", "trainer-gpu-")  # 4 characters
    assert not is_generated_name("trainer-gpu-aaaaa", "trainer-gpu-")  # vowels are never generated
    assert not is_generated_name("other-gpu-b7x2q", "trainer-gpu-")


# ----- finding the claim --------------------------------------------------------------------


def test_offline_claim_is_named_with_the_cut_and_carries_generate_name() -> None:
    resolved = resolve_pod(pod(LONG_POD, LONG_CLAIM), ClaimIndex([], [template()]))
    [entry] = resolved.claims
    assert entry.generated
    assert entry.claim_name == "a" * 36 + "-gpu-claim-with-a-lo"
    assert entry.claim is not None
    assert entry.claim["metadata"]["generateName"] == "a" * 36 + "-gpu-claim-with-a-lo"


def test_status_names_the_claim_first() -> None:
    recorded = owned_claim("trainer-gpu-k9w4z", "trainer", "uid-1")
    adoptable = owned_claim("trainer-gpu-zzzzz", "trainer", "uid-1", pod_claim="gpu")
    statuses = [{"name": "gpu", "resourceClaimName": "trainer-gpu-k9w4z"}]
    resolved = resolve_pod(
        pod("trainer", "gpu", statuses=statuses), ClaimIndex([adoptable, recorded], [template()])
    )
    [entry] = resolved.claims
    assert (entry.claim_name, entry.generated, entry.problem) == ("trainer-gpu-k9w4z", False, None)


def test_recorded_claim_not_owned_by_the_pod_is_refused_as_the_scheduler_does() -> None:
    stranger = owned_claim("trainer-gpu-k9w4z", "trainer", "uid-OTHER")
    statuses = [{"name": "gpu", "resourceClaimName": "trainer-gpu-k9w4z"}]
    resolved = resolve_pod(pod("trainer", "gpu", statuses=statuses), ClaimIndex([stranger], [template()]))
    [entry] = resolved.claims
    assert entry.problem == (
        "ResourceClaim default/trainer-gpu-k9w4z was not created for Pod default/trainer (Pod is not owner)"
    )


def test_recorded_claim_being_deleted_is_refused() -> None:
    recorded = owned_claim("trainer-gpu-k9w4z", "trainer", "uid-1")
    recorded["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    statuses = [{"name": "gpu", "resourceClaimName": "trainer-gpu-k9w4z"}]
    resolved = resolve_pod(pod("trainer", "gpu", statuses=statuses), ClaimIndex([recorded], [template()]))
    assert resolved.claims[0].problem == 'resourceclaim "trainer-gpu-k9w4z" is being deleted'


def test_unrecorded_claim_owned_by_uid_with_the_annotation_is_adopted() -> None:
    made = owned_claim("a" * 36 + "-gpu-claim-with-a-lob7x2q", LONG_POD, "uid-1", pod_claim=LONG_CLAIM)
    resolved = resolve_pod(pod(LONG_POD, LONG_CLAIM), ClaimIndex([made], [template()]))
    [entry] = resolved.claims
    assert (entry.claim_name, entry.generated) == ("a" * 36 + "-gpu-claim-with-a-lob7x2q", False)


def test_annotated_claim_of_another_pod_uid_is_not_adopted() -> None:
    made = owned_claim("trainer-gpu-b7x2q", "trainer", "uid-OLD", pod_claim="gpu")
    resolved = resolve_pod(pod("trainer", "gpu", uid="uid-NEW"), ClaimIndex([made], [template()]))
    [entry] = resolved.claims
    assert (entry.claim_name, entry.generated) == ("trainer-gpu", True)


# ----- explain ------------------------------------------------------------------------------


def write_objects(tmp_path: Path, *objects: dict[str, Any]) -> list[str]:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all([device_class("gpu"), template(), *objects]))
    return ["--objects", str(path)]


def test_explain_finds_a_long_named_claim_by_its_cut_and_its_uncut_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = write_objects(tmp_path, pod(LONG_POD, LONG_CLAIM))
    cut = "a" * 36 + "-gpu-claim-with-a-lo"
    for name in (cut, f"{LONG_POD}-{LONG_CLAIM}"):
        main(["explain", name, *objects, "-o", "json"])
        data = json.loads(capsys.readouterr().out)
        assert (data["claim"], data["generateName"]) == (f"default/{cut}", cut)


def test_explain_pod_uses_the_claim_its_status_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = owned_claim("a" * 36 + "-gpu-claim-with-a-lok9w4z", LONG_POD, "uid-1")
    statuses = [{"name": LONG_CLAIM, "resourceClaimName": real["metadata"]["name"]}]
    objects = write_objects(tmp_path, pod(LONG_POD, LONG_CLAIM, statuses=statuses), real)
    main(["explain", f"pod/{LONG_POD}", *objects, "-o", "json"])
    data = json.loads(capsys.readouterr().out)
    [entry] = data["claims"]
    assert (entry["claim"], entry["generatedFrom"]) == ("default/" + real["metadata"]["name"], None)


def test_explain_pod_names_a_recorded_claim_the_pod_does_not_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stranger = owned_claim("trainer-gpu-k9w4z", "trainer", "uid-OTHER")
    statuses = [{"name": "gpu", "resourceClaimName": "trainer-gpu-k9w4z"}]
    objects = write_objects(tmp_path, pod("trainer", "gpu", statuses=statuses), stranger)
    assert main(["explain", "pod/trainer", *objects, "-o", "json"]) == 1
    [entry] = json.loads(capsys.readouterr().out)["claims"]
    assert entry["summary"] == (
        "claim default/trainer-gpu-k9w4z: ResourceClaim default/trainer-gpu-k9w4z was not created for "
        "Pod default/trainer (Pod is not owner)"
    )
