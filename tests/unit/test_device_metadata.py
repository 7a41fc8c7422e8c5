"""Device metadata (KEP-5304) written by the driver: paths, modes, content, names, failures, crashes.

What upstream's helper writes for the same claim, byte for byte, is
tests/integration/test_device_metadata_upstream.py's subject (it needs the Go
harness); here the driver runs on a temp directory with the fake API of
test_prepare_driver.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from draplugin import crashpoints, statefile
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.metadata import POD_CLAIM_NAME_ANNOTATION, _go_json
from draplugin.prepare.metadatastore import MetadataStore
from tests.unit.test_prepare_driver import Node, SimulatedCrash
from tests.unit.test_prepare_plan import DRIVER, claim_doc, config, gpu_config, result

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"


class MetadataNode(Node):
    """A node whose driver writes device metadata below `<root>/plugin`."""

    enabled: bool = True

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugin"

    @property
    def metadata_root(self) -> Path:
        return self.plugin_dir / "dra-device-metadata"

    def driver(self, recover: bool = True) -> GpuDriver:
        driver = super().driver(recover=False)
        driver.metadata = MetadataStore(
            self.plugin_dir, self.cdi_root, self.driver_name, enabled=self.enabled
        )
        if recover:
            driver.recover()
        return driver

    def metadata_files(self) -> list[str]:
        """Every file of device metadata on the node, relative to the node's root."""
        found = (
            [p for p in self.metadata_root.rglob("*") if p.is_file()] if self.metadata_root.exists() else []
        )
        found += self.cdi_root.glob(f"{DRIVER}_metadata_*") if self.cdi_root.exists() else []
        return sorted(str(p.relative_to(self.root)) for p in found)


@pytest.fixture
def node(tmp_path: Path) -> MetadataNode:
    return MetadataNode(tmp_path)


def doc_of(path: Path) -> dict[str, Any]:
    """The stream's first document (the newest version)."""
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    assert isinstance(first, dict)
    return first


def documents(path: Path) -> list[dict[str, Any]]:
    decoder, text, out = json.JSONDecoder(), path.read_text(), []
    index = 0
    while text[index:].strip():
        value, end = decoder.raw_decode(text, index)
        out.append(value)
        index = end
        while index < len(text) and text[index].isspace():
            index += 1
    return out


async def test_prepare_writes_document_and_spec_where_upstream_does(node: MetadataNode) -> None:
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")]))
    devices = await node.driver().prepare_claim(ref)

    document = node.metadata_root / "ns_claim" / "gpu" / "metadata.json"
    spec = node.cdi_root / f"{DRIVER}_metadata_uid-1_gpu.json"
    assert node.metadata_files() == sorted(str(p.relative_to(node.root)) for p in (document, spec))
    assert stat.S_IMODE(document.stat().st_mode) == 0o644 and stat.S_IMODE(spec.stat().st_mode) == 0o644
    for directory in (node.metadata_root, document.parent.parent, document.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    # The request's metadata device goes to its first device only, after the device's own.
    assert [d.cdi_device_ids for d in devices] == [
        (f"{DRIVER}/gpu=uid-1-gpu-0", f"{DRIVER}/metadata=uid-1_gpu"),
        (f"{DRIVER}/gpu=uid-1-gpu-1",),
    ]
    versions = [d["apiVersion"] for d in documents(document)]
    assert versions == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
    first = doc_of(document)
    assert first["kind"] == "DeviceMetadata"
    assert first["metadata"] == {"name": "claim", "namespace": "ns", "uid": "uid-1", "generation": 1}
    assert "podClaimName" not in first
    (request,) = first["requests"]
    assert request["name"] == "gpu"
    assert [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
        (DRIVER, "node-a", "gpu-0"),
        (DRIVER, "node-a", "gpu-1"),
    ]
    attributes = request["devices"][0]["attributes"]
    published = node.driver(recover=False).devices["gpu-0"].to_api()["attributes"]
    assert {k: v for k, v in attributes.items() if k in published} == published
    assert attributes["sharingStrategy"] == {"string": "Exclusive"}

    cdi = json.loads(spec.read_text())
    assert cdi["kind"] == f"{DRIVER}/metadata"
    assert cdi["devices"] == [{
        "name": "uid-1_gpu",
        "containerEdits": {"mounts": [{
            "hostPath": str(document),
            "containerPath": f"{CONTAINER_DIR}/resourceclaims/claim/gpu/{DRIVER}-metadata.json",
            "options": ["ro", "bind"],
        }]},
    }]  # fmt: skip


async def test_template_claim_mounts_under_its_pod_claim_name(node: MetadataNode) -> None:
    doc = claim_doc(name="pod-gpu-x7k2p", results=[result("gpu", "gpu-0")])
    doc["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu-claim"}
    ref = node.claims.add(doc)
    await node.driver().prepare_claim(ref)
    document = node.metadata_root / "ns_pod-gpu-x7k2p" / "gpu" / "metadata.json"
    assert doc_of(document)["podClaimName"] == "gpu-claim"
    spec = json.loads((node.cdi_root / f"{DRIVER}_metadata_uid-1_gpu.json").read_text())
    (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
    assert (
        mount["containerPath"]
        == f"{CONTAINER_DIR}/resourceclaimtemplates/gpu-claim/gpu/{DRIVER}-metadata.json"
    )


async def test_subrequest_files_under_its_request_and_named_in_full(node: MetadataNode) -> None:
    ref = node.claims.add(claim_doc(results=[result("gpu/big", "gpu-0"), result("spare", "gpu-1")]))
    devices = await node.driver().prepare_claim(ref)
    assert (
        doc_of(node.metadata_root / "ns_claim" / "gpu" / "metadata.json")["requests"][0]["name"] == "gpu/big"
    )
    assert (
        doc_of(node.metadata_root / "ns_claim" / "spare" / "metadata.json")["requests"][0]["name"] == "spare"
    )
    assert [d.cdi_device_ids[-1] for d in devices] == [
        f"{DRIVER}/metadata=uid-1_gpu",
        f"{DRIVER}/metadata=uid-1_spare",
    ]


async def test_document_carries_what_the_config_made_of_the_device(node: MetadataNode) -> None:
    sliced = config("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Long"}))
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")], configs=[sliced]))
    await node.driver().prepare_claim(ref)
    attributes = doc_of(node.metadata_root / "ns_claim" / "gpu" / "metadata.json")["requests"][0]["devices"][
        0
    ]["attributes"]
    assert attributes["sharingStrategy"] == {"string": "TimeSlicing"}
    assert attributes["timeSliceInterval"] == {"string": "Long"}


def test_document_escapes_as_go_does() -> None:
    # Go's encoding/json escapes <, >, & (and U+2028/9) even in MarshalIndent; other text stays UTF-8.
    assert _go_json({"a": "<&>\u2028é"}) == b'{\n  "a": "\\u003c\\u0026\\u003e\\u2028\xc3\xa9"\n}'


@pytest.mark.parametrize(
    ("namespace", "name", "request_name", "expected"),
    [
        ("..", "claim", "gpu", "namespace '..'"),
        ("ns", "a/../../../etc", "gpu", "name 'a/../../../etc'"),
        ("ns", "claim", "../../x", "request '..'"),
        ("n" * 63, "c" * 253, "gpu", "longer than the 255 bytes"),
    ],
)
async def test_unsafe_names_fail_the_claim_and_write_nothing(
    node: MetadataNode, namespace: str, name: str, request_name: str, expected: str
) -> None:
    ref = node.claims.add(claim_doc(namespace=namespace, name=name, results=[result(request_name, "gpu-0")]))
    with pytest.raises(ClaimError, match=r"cannot name a device metadata file|longer than") as caught:
        await node.driver().prepare_claim(ref)
    assert expected in str(caught.value)
    assert node.metadata_files() == []
    assert not any(p.name == "metadata.json" for p in node.root.rglob("*"))


async def test_a_symlink_out_of_the_metadata_dir_is_refused(node: MetadataNode, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    node.metadata_root.mkdir(parents=True)
    (node.metadata_root / "ns_claim").symlink_to(outside)
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    with pytest.raises(ClaimError, match=r"device metadata cannot be written.*outside"):
        await node.driver().prepare_claim(ref)
    assert list(outside.iterdir()) == []


async def test_a_full_disk_fails_the_claim_alone_and_the_retry_succeeds(
    node: MetadataNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = statefile.atomic_write

    def full(path: Path, content: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
        # What write(2) answers on a full filesystem.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    driver = node.driver()
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    monkeypatch.setattr(statefile, "atomic_write", full)
    with pytest.raises(ClaimError, match=r"device metadata cannot be written.*No space left"):
        await driver.prepare_claim(ref)
    record = driver.checkpoint.get("uid-1")
    assert record is not None and not record.completed  # not answered as prepared
    monkeypatch.setattr(statefile, "atomic_write", real)
    devices = await driver.prepare_claim(ref)
    assert devices[0].cdi_device_ids[-1] == f"{DRIVER}/metadata=uid-1_gpu"


async def test_unprepare_removes_both_and_keeps_a_newer_claim_of_the_same_name(node: MetadataNode) -> None:
    driver = node.driver()
    old = node.claims.add(claim_doc(uid="uid-old", results=[result("gpu", "gpu-0")]))
    await driver.prepare_claim(old)
    await driver.unprepare_claim(old)
    assert node.metadata_files() == []

    await driver.prepare_claim(node.claims.add(claim_doc(uid="uid-old", results=[result("gpu", "gpu-0")])))
    node.claims.remove(old)
    new = node.claims.add(claim_doc(uid="uid-new", results=[result("gpu", "gpu-1")]))
    # The old claim's unprepare comes late, after the new one of the same name was prepared.
    await driver.unprepare_claim(old)
    await driver.prepare_claim(new)
    await driver.unprepare_claim(old)
    assert node.metadata_files() == [
        f"cdi/{DRIVER}_metadata_uid-new_gpu.json",
        "plugin/dra-device-metadata/ns_claim/gpu/metadata.json",
    ]


async def test_off_writes_nothing_and_still_removes_what_was_written(node: MetadataNode) -> None:
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    await node.driver().prepare_claim(ref)
    node.enabled = False
    driver = node.driver()
    other = node.claims.add(claim_doc(uid="uid-2", name="other", results=[result("gpu", "gpu-1")]))
    assert [d.cdi_device_ids for d in await driver.prepare_claim(other)] == [(f"{DRIVER}/gpu=uid-2-gpu-1",)]
    assert len(node.metadata_files()) == 2  # the first claim's, still prepared
    await driver.unprepare_claim(ref)
    assert node.metadata_files() == []


async def test_kill_after_metadata_write_leaves_nothing_no_claim_holds(
    node: MetadataNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reach(point: str) -> None:
        # A SIGKILL at the point, as test_prepare_driver's crash_at stands it in.
        if point == crashpoints.AFTER_METADATA_WRITE:
            raise SimulatedCrash(point)

    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(SimulatedCrash):
        await node.driver().prepare_claim(ref)
    monkeypatch.undo()
    assert len(node.metadata_files()) == 2
    restarted = node.driver()  # start-up: no durable record holds the claim
    assert node.metadata_files() == [] and node.spec_files() == []
    devices = await restarted.prepare_claim(ref)  # the kubelet's retry
    assert devices[0].cdi_device_ids[-1] == f"{DRIVER}/metadata=uid-1_gpu"
    assert len(node.metadata_files()) == 2


async def test_start_up_keeps_prepared_claims_restores_their_specs_and_sweeps_temp_files(
    node: MetadataNode,
) -> None:
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    await node.driver().prepare_claim(ref)
    spec = node.cdi_root / f"{DRIVER}_metadata_uid-1_gpu.json"
    content = spec.read_bytes()
    spec.unlink()  # /var/run/cdi emptied on the same boot
    request_dir = node.metadata_root / "ns_claim" / "gpu"
    # What a kill between atomic_write's create and rename leaves, from before this process started.
    temp = request_dir / ".metadata.json.k3j9x2ab.tmp"
    temp.write_text('{"kind": "DeviceMeta')
    old = time.time() - 3600
    os.utime(temp, (old, old))
    report = node.driver(recover=False).recover()
    assert spec.read_bytes() == content
    assert str(temp) in report.temp_files_removed and not temp.exists()
    assert doc_of(request_dir / "metadata.json")["metadata"]["uid"] == "uid-1"


def test_the_setting_turns_writing_off_and_names_the_plugin_directory(tmp_path: Path) -> None:
    from draplugin import config as plugin_config
    from draplugin.prepare.wiring import metadata_store

    environ = {"DEVICE_METADATA": "off", "KUBELET_ROOT_DIR": str(tmp_path)}
    settings = plugin_config.load({"node_name": "n"}, environ=environ)
    store = metadata_store(settings)
    assert not store.enabled
    assert store.root == tmp_path / "plugins" / settings.driver_name / "dra-device-metadata"
    assert metadata_store(plugin_config.load({"node_name": "n"}, environ={})).enabled  # auto: on
    with pytest.raises(plugin_config.ConfigError, match=r"--device-metadata \(DEVICE_METADATA\): 'yes'"):
        plugin_config.load({"node_name": "n"}, environ={"DEVICE_METADATA": "yes"})


async def test_unprepare_of_an_unsafe_name_looks_nowhere_outside(node: MetadataNode, tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "gpu"
    victim.mkdir(parents=True)
    (victim / "metadata.json").write_text("{}")
    driver = node.driver()
    (node.metadata_root / "ns_x").mkdir(parents=True)  # some claim x's directory
    # "ns_" + this name is the victim's directory, seen from inside the metadata directory.
    bad = ClaimRef("ns", "uid-9", "x/../../../victim")
    assert (node.metadata_root / f"ns_{bad.name}").resolve() == victim.parent
    await driver.unprepare_claim(bad)
    assert (victim / "metadata.json").exists()
