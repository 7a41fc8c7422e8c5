"""Our device metadata files checked by upstream's own code, and against what its helper writes.

The judge is tests/cluster/metadatacheck, a Go harness on
`k8s.io/dynamic-resource-allocation` v0.37.2 (built and cached by
tests/cluster/build_metadatacheck.sh; `DRA_METADATACHECK_DIR` names a built one):

- `decode`: every document we write is read with `devicemetadata.DecodeMetadataFromStream`,
  validation on, and every metadata CDI spec with the CDI project's spec types;
- `write`: upstream's kubelet plugin helper, started with `EnableDeviceMetadata` and driven over
  its own gRPC socket as the kubelet drives it, prepares and unprepares the same claim with the
  same devices and attributes; its files and ours are compared name by name, mode by mode and
  byte by byte (CDI specs field by field: only the host directory differs).

The driver is ours on a temp directory (test_device_metadata's node) with the fake backend's
inventory of examples/fake-gpus.yaml, MIG devices included. No harness: the tests fail, saying how
to build it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from draplugin.devices import load_backend
from draplugin.devices.model import Device
from draplugin.kubelet.interface import PreparedDevice
from draplugin.prepare.metadata import POD_CLAIM_NAME_ANNOTATION
from tests.unit.test_device_metadata import MetadataNode
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, config, gpu_config, result

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tests" / "cluster" / "build_metadatacheck.sh"
VERSIONS = ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]


@pytest.fixture(scope="module")
def harness() -> Path:
    chosen = os.environ.get("DRA_METADATACHECK_DIR")
    if chosen:
        binary = Path(chosen) / "metadatacheck"
    else:
        done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            pytest.fail(f"{BUILD_SCRIPT} failed ({done.returncode}): {done.stderr[-2000:]}", pytrace=False)
        binary = Path(done.stdout.strip().splitlines()[-1]) / "metadatacheck"
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: build it with {BUILD_SCRIPT}", pytrace=False)
    return binary


def run(harness: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([str(harness), *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def fake_devices(tmp: Path) -> dict[str, Device]:
    backend = load_backend(
        "fake", NODE, config_file=str(REPO_ROOT / "examples" / "fake-gpus.yaml"), device_dir=str(tmp / "dev")
    )
    return {device.name: device for device in backend.discover()}


@dataclass
class FakeGpuNode(MetadataNode):
    """test_device_metadata's node on the inventory of examples/fake-gpus.yaml."""

    inventory: dict[str, Device] = field(default_factory=dict)

    def driver(self, recover: bool = True) -> Any:
        driver = super().driver(recover=False)
        driver.devices = self.inventory
        if recover:
            driver.recover()
        return driver


@pytest.fixture
def node(tmp_path: Path) -> Iterator[FakeGpuNode]:
    node = FakeGpuNode(tmp_path / "ours")
    node.inventory = fake_devices(tmp_path)
    yield node


def mig_device(node: FakeGpuNode) -> str:
    return next(name for name, device in node.inventory.items() if device.kind == "mig")


def claims(node: FakeGpuNode) -> dict[str, dict[str, Any]]:
    """One claim per shape the contract distinguishes."""
    template = claim_doc(uid="uid-template", name="pod-a-gpu-7xk2p", results=[result("gpu", "gpu-1")])
    template["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    sliced = config("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Short"}))
    return {
        "direct": claim_doc(uid="uid-direct", name="direct", results=[result("gpu", "gpu-0")]),
        "template": template,
        "subrequest": claim_doc(
            uid="uid-subrequest",
            name="subrequest",
            results=[result("gpu/big", "gpu-2"), result("small", mig_device(node))],
        ),
        "time-sliced": claim_doc(
            uid="uid-sliced",
            name="sliced",
            namespace="team-b",
            results=[result("gpu", "gpu-0")],
            configs=[sliced],
        ),
    }


@pytest.mark.parametrize("shape", ["direct", "template", "subrequest", "time-sliced"])
async def test_upstream_reader_decodes_and_validates_every_file_we_write(
    node: FakeGpuNode, harness: Path, shape: str
) -> None:
    doc = claims(node)[shape]
    await node.driver().prepare_claim(node.claims.add(doc))
    verdicts = run(harness, "decode", str(node.root))["files"]
    requests = {r["request"].partition("/")[0] for r in doc["status"]["allocation"]["devices"]["results"]}
    assert sorted(v["kind"] for v in verdicts) == sorted(["metadata", "cdi"] * len(requests))
    for verdict in verdicts:
        assert verdict["ok"], verdict
        assert verdict["mode"] == "0644"
        if verdict["kind"] == "metadata":
            # The newest version comes first and is what a current reader takes.
            assert verdict["gvk"] == "metadata.resource.k8s.io/v1beta1, Kind=DeviceMetadata"
            decoded = verdict["decoded"]
            assert decoded["metadata"]["uid"] == doc["metadata"]["uid"]
            (request,) = decoded["requests"]
            for device in request["devices"]:
                published = node.inventory[device["name"]].to_api()["attributes"]
                assert {k: v for k, v in device["attributes"].items() if k in published} == published
        else:
            assert verdict["cdiVersion"] == verdict["minVersion"]
            ((mount,),) = [d["containerEdits"]["mounts"] for d in verdict["devices"]]
            assert mount["options"] == ["ro", "bind"]
            assert mount["hostPath"] in {v["path"] for v in verdicts if v["kind"] == "metadata"}


def job(doc: dict[str, Any], prepared: list[PreparedDevice], ours: Path) -> dict[str, Any]:
    """Upstream's helper given what our driver gave: the claim, each device with its own CDI ID and
    the attributes our document carries for it (so the comparison is of the files, not the data)."""
    attributes: dict[tuple[str, str], Any] = {}
    for document in ours.glob("plugin/dra-device-metadata/*/*/metadata.json"):
        first, _ = json.JSONDecoder().raw_decode(document.read_text())
        for request in first["requests"]:
            for device in request["devices"]:
                attributes[(request["name"], device["name"])] = device["attributes"]
    results = doc["status"]["allocation"]["devices"]["results"]
    devices = []
    for entry, device in zip(results, prepared, strict=True):
        devices.append({
            "requests": [entry["request"]],
            "pool": entry["pool"],
            "device": entry["device"],
            "cdiDeviceIDs": [device.cdi_device_ids[0]],
            "attributes": attributes[(entry["request"], entry["device"])],
        })  # fmt: skip
    return {
        "driver": DRIVER,
        "node": NODE,
        "versions": VERSIONS,
        "claim": doc,
        "devices": devices,
        "unprepare": True,
    }


def ours_listing(root: Path) -> dict[str, dict[str, Any]]:
    """What upstream's harness lists, for our side: metadata paths with their modes and content."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if not (rel.startswith("plugin/") or "_metadata_" in rel):
            continue
        mode = f"0{oct(path.stat().st_mode & 0o777)[2:]}"
        out[rel] = (
            {"mode": mode, "dir": True} if path.is_dir() else {"mode": mode, "content": path.read_text()}
        )
    return out


def theirs_listing(listing: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        rel: {k: v for k, v in entry.items() if k != "dir" or v}
        for rel, entry in listing.items()
        if rel.startswith("plugin/") or "_metadata_" in rel
    }


def cdi_view(content: str, root: Path) -> dict[str, Any]:
    """A metadata CDI spec with its host directory made relative; an empty spec-level edits block
    (Go's struct has no omitempty there) counts as none."""
    spec: dict[str, Any] = json.loads(content)
    if spec.get("containerEdits") == {}:
        del spec["containerEdits"]
    for device in spec["devices"]:
        for mount in device["containerEdits"]["mounts"]:
            mount["hostPath"] = str(Path(mount["hostPath"]).relative_to(root))
    return spec


@pytest.mark.parametrize("shape", ["direct", "template", "subrequest", "time-sliced"])
async def test_our_files_equal_what_upstreams_helper_writes_for_the_same_claim(
    node: FakeGpuNode, harness: Path, tmp_path: Path, shape: str
) -> None:
    doc = claims(node)[shape]
    ref = node.claims.add(doc)
    driver = node.driver()
    prepared = await driver.prepare_claim(ref)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(job(doc, prepared, node.root)))
    theirs_root = tmp_path / "theirs"
    answer = run(harness, "write", str(job_file), str(theirs_root))

    # The kubelet gets the same CDI devices from both: each device's own, the request's metadata
    # device on its first device.
    (their_claim,) = answer["prepare"]["claims"].values()
    assert [tuple(d["cdi_device_ids"]) for d in their_claim["devices"]] == [
        d.cdi_device_ids for d in prepared
    ]

    ours, theirs = ours_listing(node.root), theirs_listing(answer["afterPrepare"])
    assert sorted(ours) == sorted(theirs)
    assert any(rel.endswith("metadata.json") for rel in ours)
    for rel in ours:
        assert ours[rel]["mode"] == theirs[rel]["mode"], rel
        if rel.endswith("metadata.json"):
            assert ours[rel]["content"] == theirs[rel]["content"], rel  # byte for byte
        elif "content" in ours[rel]:
            assert cdi_view(ours[rel]["content"], node.root) == cdi_view(
                theirs[rel]["content"], theirs_root
            ), rel

    # Unprepare leaves the same behind on both sides: the metadata directory itself, no file.
    await driver.unprepare_claim(ref)
    assert sorted(ours_listing(node.root)) == sorted(theirs_listing(answer["afterUnprepare"]))
