"""The fault suite, durability: `draplugin run` against the real API server (through `tests.faultproxy`)
with its state directory on a full filesystem, and a corrupt checkpoint recovered while the API server
is away.

What the kubelet and a running pod depend on: no claim is answered as prepared unless its record is
on disk, so a restart keeps the running pod's CDI spec and gives its exclusive GPU to nobody else;
and a claim whose spec survived a lost checkpoint keeps its MIG instance across every restart until
the kubelet prepares or unprepares it.

The full disk is a 1 MiB tmpfs on the state directory only (the CDI root stays writable), filled up
by the test: the plugin's writes fail with ENOSPC as on a node. Mounting needs root; without it the
disk test is skipped, and the unit tests (tests/unit/test_driver_durability.py) cover the same rule
with the failure injected at the checkpoint's write.

Size: two rigs (a state dir on a tmpfs, fake GPUs with MIG) around the fault suite's helpers.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from draplugin.devices.fakemig import STATE_FILE as FAKE_MIG_STATE
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.ledger import FILE_NAME as LEDGER_FILE
from tests.faultrig import proxied_plugin
from tests.integration.test_faults_plugin import (
    API_DEADLINE_S,
    DRIVER,
    KUBELET_DEADLINE_S,
    Rig,
    assert_node_consistent,
    prepare,
    unprepare,
)

pytestmark = pytest.mark.cluster

STATE_FS_SIZE = "1m"
MIG_DEVICE = "gpu-0-mig-2g10gb-2"  # a 2g.10gb MIG device of the fake A100-SXM4-40GB, made at prepare


@dataclass
class LogOutsideState(PluginProcess):
    """The plugin with its log next to the state directory, not in it: a full state filesystem must
    not cost the log that says what happened."""

    log_file: Path = Path("/dev/null")

    @property
    def log_path(self) -> Path:
        return self.log_file


def allocated(api: KubeApi, namespace: str, node: str, device: str) -> ClaimRef:
    """A claim allocated `device` of `node`, as the scheduler leaves it (no pod: not reserved)."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    created = api.create(base, {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "durable-"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    })  # fmt: skip
    name = created["metadata"]["name"]
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device},
    ]}}}  # fmt: skip
    api.patch_status(f"{base}/{name}", {"status": status})
    return ClaimRef(namespace, created["metadata"]["uid"], name)


@pytest.fixture(scope="module")
def place(kube_cluster: ControlPlane) -> Iterator[tuple[KubeApi, str, str]]:
    """A fake node and a namespace for this module's claims."""
    from devcluster.objects import create_fake_node, create_namespace, delete_fake_node, delete_namespace

    with kube_cluster.api_client() as client:
        node = f"durable-{uuid.uuid4().hex[:6]}"
        create_fake_node(client, node)
        namespace = create_namespace(client)
        try:
            yield KubeApi(client), node, namespace
        finally:
            delete_namespace(client, namespace)
            delete_fake_node(client, node)


def make_rig(kube_cluster: ControlPlane, place: tuple[KubeApi, str, str], gpus_yaml: str) -> Rig:
    api, node, namespace = place
    root, proxy, plugin = proxied_plugin(
        kube_cluster,
        node,
        prefix="dur-",
        gpus_yaml=gpus_yaml,
        api_deadline_s=API_DEADLINE_S,
        plugin_class=LogOutsideState,
    )
    plugin.log_file = root / "plugin.log"
    return Rig(api, node, namespace, root, proxy, plugin)


def close_rig(rig: Rig) -> None:
    rig.plugin.stop()
    rig.proxy.close()
    print(f"plugin log tail:\n{rig.plugin.log_tail(30)}")


@pytest.fixture
def full_disk_rig(kube_cluster: ControlPlane, place: tuple[KubeApi, str, str]) -> Iterator[Rig]:
    """Two exclusive GPUs; the state directory a tmpfs of its own, unmounted by the finalizer."""
    if os.geteuid() != 0:
        pytest.skip("mounting the state directory's tmpfs needs root (the unit tests cover the rule)")
    rig = make_rig(kube_cluster, place, "gpus:\n  - model: A100-SXM4-40GB\n    count: 2\n")
    state = rig.plugin.state_dir
    state.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STATE_FS_SIZE},mode=0700", "tmpfs", str(state)], check=True
    )
    try:
        yield rig
    finally:
        close_rig(rig)
        subprocess.run(["umount", str(state)], check=True)
        shutil.rmtree(rig.root, ignore_errors=True)


@pytest.fixture
def mig_rig(kube_cluster: ControlPlane, place: tuple[KubeApi, str, str]) -> Iterator[Rig]:
    """One fake A100 published partitionable: its MIG devices are created at prepare."""
    rig = make_rig(
        kube_cluster, place, "partitionable: true\ngpus:\n  - model: A100-SXM4-40GB\n    count: 1\n"
    )
    try:
        yield rig
    finally:
        close_rig(rig)
        shutil.rmtree(rig.root, ignore_errors=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem of `directory` until a write fails with ENOSPC; the filler file."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    # Unbuffered: the write that fails is the last one, and closing has nothing left to flush.
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    return filler


async def test_a_full_state_filesystem_never_gets_a_claim_answered_prepared_without_its_record(
    full_disk_rig: Rig,
) -> None:
    rig = full_disk_rig
    a = allocated(rig.api, rig.namespace, rig.node, "gpu-0")
    b = allocated(rig.api, rig.namespace, rig.node, "gpu-0")  # the same exclusive GPU: a second pod
    c = allocated(rig.api, rig.namespace, rig.node, "gpu-1")
    rig.start()
    channel = await rig.channel()
    assert (await prepare(channel, [c], KUBELET_DEADLINE_S))[c.uid] == ""

    filler = fill(rig.plugin.state_dir)
    refused = (await prepare(channel, [a], KUBELET_DEADLINE_S))[a.uid]
    assert "No space left on device" in refused, refused
    # An unprepare whose write failed fails too (the file still says prepared).
    assert "No space left on device" in (await unprepare(channel, [c], KUBELET_DEADLINE_S))[c.uid]
    filler.unlink()

    # The kubelet's retries: answered only once the record is on disk.
    assert (await prepare(channel, [a], KUBELET_DEADLINE_S))[a.uid] == ""
    assert a.uid in rig.records(), f"claim answered prepared with no record on disk: {rig.records()}"
    assert (await unprepare(channel, [c], KUBELET_DEADLINE_S))[c.uid] == ""
    assert c.uid not in rig.records(), f"claim answered unprepared, still prepared on disk: {rig.records()}"
    await channel.close()

    # A restart keeps the running pod's spec, and its exclusive GPU goes to no second claim.
    rig.plugin.stop()
    rig.start()
    channel = await rig.channel()
    assert_node_consistent(rig, {a.uid})
    assert "already prepared for claim" in (await prepare(channel, [b], KUBELET_DEADLINE_S))[b.uid]
    assert (await prepare(channel, [c], KUBELET_DEADLINE_S))[c.uid] == ""  # gpu-1 was given back
    assert set((await unprepare(channel, [a, b, c], KUBELET_DEADLINE_S)).values()) == {""}
    assert rig.specs() == {}
    await channel.close()


def mig_instances(rig: Rig) -> list[dict[str, Any]]:
    """The fake GPU's MIG instances: the "hardware", which outlives the plugin process."""
    path = rig.plugin.state_dir / FAKE_MIG_STATE
    return list(json.loads(path.read_text()).get("instances", [])) if path.exists() else []


def ledger_claims(rig: Rig) -> set[str]:
    path = rig.plugin.state_dir / LEDGER_FILE
    text = path.read_text() if path.exists() else "{}"
    return {entry["claim"] for entry in json.loads(text).get("entries", [])}


async def test_a_corrupt_checkpoint_recovered_with_the_api_away_keeps_the_running_claims_mig_instance(
    mig_rig: Rig,
) -> None:
    rig = mig_rig
    m = allocated(rig.api, rig.namespace, rig.node, MIG_DEVICE)
    rig.start()
    channel = await rig.channel()
    assert (await prepare(channel, [m], KUBELET_DEADLINE_S))[m.uid] == ""
    await channel.close()
    made = mig_instances(rig)
    assert len(made) == 1 and ledger_claims(rig) == {m.uid}

    # Killed; the checkpoint torn; the API server gone while the plugin recovers, and then restarts.
    rig.plugin.kill()
    path = rig.plugin.checkpoint_path
    path.write_bytes(path.read_bytes()[:40])
    rig.proxy.set_mode("drop")
    for start in ("recovery", "ordinary restart"):
        rig.start()
        assert m.uid in rig.records(), (start, rig.records())
        assert mig_instances(rig) == made, f"{start}: the running claim's MIG instance was destroyed"
        assert ledger_claims(rig) == {m.uid}, start
        assert rig.specs() == {m.uid: [MIG_DEVICE]}, start
        rig.plugin.stop()

    # The API server is back: the kubelet's prepare completes the claim on the same instance.
    rig.proxy.set_mode("pass")
    rig.start()
    channel = await rig.channel()
    assert mig_instances(rig) == made
    assert (await prepare(channel, [m], KUBELET_DEADLINE_S))[m.uid] == ""
    assert mig_instances(rig) == made
    doc = json.loads(rig.plugin.checkpoint_path.read_text())
    assert [(c["uid"], c["state"], c["name"]) for c in doc["claims"]] == [(m.uid, "PrepareCompleted", m.name)]
    assert (await unprepare(channel, [m], KUBELET_DEADLINE_S))[m.uid] == ""
    assert mig_instances(rig) == [] and rig.specs() == {}
    await channel.close()
