"""The fault suite: `draplugin run` as its own process against the real API server, driven like the
kubelet drives it, while the API server stalls, drops or slows (through `tests.faultproxy`), the
plugin is killed with SIGKILL at random moments of 64 concurrent prepares and unprepares, its
checkpoint is corrupted in every shape we know, and claim references and gRPC frames are garbage.

Each test asserts what the kubelet and a running pod depend on: every claim is answered within the
caller's deadline; no prepared claim is lost and no spec of a prepared claim is deleted; no
exclusive device is handed out twice; no temp file is left behind; memory stays flat.

Seeded and bounded (SEEDS x 64 claims, one kill each) to fit the test command's time budget.
The figures of a run are logged at INFO (`-o log_cli=true` shows them).

Size: one rig (plugin, proxy, claims) shared by every fault.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from devcluster.controlplane import ControlPlane
from devcluster.plugin import PluginProcess
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi
from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet.interface import ClaimRef
from tests.faultproxy import FaultProxy
from tests.faultrig import proxied_plugin
from tests.kubelet_client import FakeKubelet

pytestmark = pytest.mark.cluster

log = logging.getLogger(__name__)

DRIVER = DEFAULT_DRIVER_NAME
GPUS = 8
CLAIMS = 64
SEEDS = (11, 23, 37)
KUBELET_DEADLINE_S = 45.0  # the kubelet's timeout for NodePrepareResources
API_DEADLINE_S = 3.0  # the plugin's --prepare-api-deadline in these tests: stalls cost seconds, not 40
RSS_GROWTH_LIMIT_MIB = 25.0
SPEC_PREFIX = f"{DRIVER}-claim_"


@dataclass
class Rig:
    """One fake node: the plugin process behind a fault proxy, and claims allocated on its GPUs."""

    api: KubeApi
    node: str
    namespace: str
    root: Path
    proxy: FaultProxy
    plugin: PluginProcess
    refs: list[ClaimRef] = field(default_factory=list)

    @property
    def cdi_root(self) -> Path:
        return self.plugin.cdi_root

    def start(self) -> None:
        self.plugin.start(timeout_s=60)

    async def channel(self) -> grpc.aio.Channel:
        """Register like the kubelet does and return the channel to the plugin's DRA socket."""
        kubelet = FakeKubelet(self.plugin.kubelet_root_dir / "plugins_registry")
        async with asyncio.timeout(30):
            return (await kubelet.register_plugin()).channel

    def specs(self) -> dict[str, list[str]]:
        """Claim UID -> devices of each spec of ours in the CDI root."""
        found = {}
        for path in self.cdi_root.glob(f"{SPEC_PREFIX}*.json"):
            uid = path.name[len(SPEC_PREFIX) : -len(".json")]
            doc = json.loads(path.read_text())
            found[uid] = [d["name"].removeprefix(f"{uid}-") for d in doc["devices"]]
        return found

    def records(self) -> dict[str, list[str]]:
        """Claim UID -> devices of each record of the plugin's checkpoint file."""
        doc = json.loads(self.plugin.checkpoint_path.read_text())
        return {c["uid"]: [d["device"] for d in c["devices"]] for c in doc["claims"]}

    def metadata(self) -> dict[str, list[str]]:
        """Claim UID -> the device metadata files of it on the node (docs/device-metadata.md): its
        CDI specs and its documents (by the UID each names)."""
        found: dict[str, list[str]] = {}
        for path in self.cdi_root.glob(f"{DRIVER}_metadata_*.json"):
            uid = path.name.removeprefix(f"{DRIVER}_metadata_").rpartition("_")[0]
            found.setdefault(uid, []).append(path.name)
        for path in self.metadata_root.glob("*/*/metadata.json"):
            first, _ = json.JSONDecoder().raw_decode(path.read_text())
            found.setdefault(first["metadata"]["uid"], []).append(str(path.relative_to(self.metadata_root)))
        return found

    @property
    def metadata_root(self) -> Path:
        return self.plugin.kubelet_root_dir / "plugins" / DRIVER / "dra-device-metadata"

    def temp_files(self) -> list[Path]:
        return [
            *self.cdi_root.glob(".*.tmp"),
            *self.plugin.state_dir.glob(".*.tmp"),
            *self.metadata_root.glob("*/*/.*.tmp"),
        ]

    def rss_mib(self) -> float:
        assert self.plugin.process is not None
        for line in Path(f"/proc/{self.plugin.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


def make_claim(api: KubeApi, namespace: str, node: str, name: str, gpu: int) -> ClaimRef:
    """A claim allocated one exclusive GPU of `node`, as the scheduler leaves it. Not reserved: there
    are no pods here, and the claim controller drops reservations for pods that do not exist."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    created = api.create(base, {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    })  # fmt: skip
    status: dict[str, Any] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu}"},
    ]}}}  # fmt: skip
    api.patch_status(f"{base}/{name}", {"status": status})
    return ClaimRef(namespace, created["metadata"]["uid"], name)


@pytest.fixture(scope="module")
def rig_parts(kube_cluster: ControlPlane) -> Iterator[tuple[KubeApi, str, str, list[ClaimRef]]]:
    """A node, a namespace and 64 claims, claim i on gpu-(i % 8): eight claims per exclusive GPU, so
    the plugin's own check is what keeps a GPU from going to two claims."""
    from devcluster.objects import create_fake_node, create_namespace, delete_fake_node, delete_namespace

    with kube_cluster.api_client() as client:
        api = KubeApi(client)
        node = f"faults-{uuid.uuid4().hex[:6]}"
        create_fake_node(client, node)
        namespace = create_namespace(client)
        try:
            refs = [make_claim(api, namespace, node, f"claim-{i}", i % GPUS) for i in range(CLAIMS)]
            yield api, node, namespace, refs
        finally:
            delete_namespace(client, namespace)
            delete_fake_node(client, node)


@pytest.fixture
def rig(kube_cluster: ControlPlane, rig_parts: tuple[KubeApi, str, str, list[ClaimRef]]) -> Iterator[Rig]:
    api, node, namespace, refs = rig_parts
    root, proxy, plugin = proxied_plugin(
        kube_cluster,
        node,
        prefix="flt-",
        gpus_yaml=f"gpus:\n  - model: A100-SXM4-40GB\n    count: {GPUS}\n",
        api_deadline_s=API_DEADLINE_S,
        plugin_class=PluginProcess,
    )
    rig = Rig(api, node, namespace, root, proxy, plugin, refs)
    try:
        yield rig
    finally:
        plugin.stop()
        proxy.close()
        log.info("plugin log tail:\n%s", plugin.log_tail(20))
        shutil.rmtree(root, ignore_errors=True)


def _claims(refs: Sequence[ClaimRef]) -> list[v1.Claim]:
    return [v1.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]


async def prepare(channel: grpc.aio.Channel, refs: Sequence[ClaimRef], deadline_s: float) -> dict[str, str]:
    """NodePrepareResources with the caller's deadline: UID -> error ('' for success), all UIDs present."""
    response = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=_claims(refs)), timeout=deadline_s
    )
    answers = {uid: entry.error for uid, entry in response.claims.items()}
    assert set(answers) == {r.uid for r in refs}
    return answers


async def unprepare(channel: grpc.aio.Channel, refs: Sequence[ClaimRef], deadline_s: float) -> dict[str, str]:
    response = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
        v1.NodeUnprepareResourcesRequest(claims=_claims(refs)), timeout=deadline_s
    )
    answers = {uid: entry.error for uid, entry in response.claims.items()}
    assert set(answers) == {r.uid for r in refs}
    return answers


def gpu_of(ref: ClaimRef, refs: Sequence[ClaimRef]) -> str:
    return f"gpu-{refs.index(ref) % GPUS}"


def assert_node_consistent(rig: Rig, prepared: set[str]) -> None:
    """What a node with running pods needs, checked on disk after a (re)start's recovery."""
    records, specs = rig.records(), rig.specs()
    held = [device for devices in records.values() for device in devices]
    assert len(held) == len(set(held)), f"an exclusive GPU is held twice: {records}"
    lost = sorted(prepared - set(records))
    assert not lost, f"prepared claims lost from the checkpoint: {lost}"
    missing = sorted(prepared - set(specs))
    assert not missing, f"specs of prepared claims deleted: {missing}"
    assert set(specs) <= set(records), "a spec without a record survived start-up"
    leaked = sorted(set(rig.metadata()) - set(records))
    assert not leaked, f"device metadata of claims no record holds survived start-up: {leaked}"
    assert all(uid in rig.metadata() for uid in prepared), "device metadata of a prepared claim is gone"
    assert rig.temp_files() == []


# --- an API server that stalls, drops, slows -------------------------------------------------------


async def test_api_stall_drop_and_slowness_get_timely_answers_and_unprepare_is_not_starved(rig: Rig) -> None:
    rig.start()
    channel = await rig.channel()
    refs = rig.refs
    figures: dict[str, Any] = {}

    rig.proxy.set_mode("hold")
    started = time.monotonic()
    answers = await prepare(channel, refs, KUBELET_DEADLINE_S)  # the kubelet's own deadline
    figures["stall_answer_s"] = round(time.monotonic() - started, 2)
    assert figures["stall_answer_s"] < API_DEADLINE_S + 2
    assert all("the API server did not answer in time" in error for error in answers.values()), answers

    # A caller deadline shorter than the setting is handed down: answered before it expires.
    started = time.monotonic()
    answers = await prepare(channel, refs[:16], 2.0)
    figures["short_deadline_answer_s"] = round(time.monotonic() - started, 2)
    assert all(answers.values()) and figures["short_deadline_answer_s"] < 2.0

    # Unprepare needs no API server: it never waits behind the prepares (of other claims: one claim's
    # calls are serialized) still stuck on it.
    stuck = asyncio.create_task(prepare(channel, refs[32:], KUBELET_DEADLINE_S))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    assert set((await unprepare(channel, refs[:32], 5.0)).values()) == {""}
    figures["unprepare_during_stall_s"] = round(time.monotonic() - started, 2)
    assert figures["unprepare_during_stall_s"] < 1.5
    await stuck

    rig.proxy.set_mode("drop")
    started = time.monotonic()
    answers = await prepare(channel, refs[:GPUS], KUBELET_DEADLINE_S)
    assert all("did not answer in time" in e for e in answers.values()), answers
    assert time.monotonic() - started < API_DEADLINE_S + 2

    rig.proxy.set_mode("slow")
    assert set((await prepare(channel, refs[:GPUS], KUBELET_DEADLINE_S)).values()) == {""}
    rig.proxy.set_mode("pass")
    assert set((await unprepare(channel, refs[:GPUS], 5.0)).values()) == {""}

    # Memory stays flat over prepare/unprepare cycles once warm.
    batch = refs[:GPUS]
    for _ in range(10):
        await prepare(channel, batch, KUBELET_DEADLINE_S)
        await unprepare(channel, batch, KUBELET_DEADLINE_S)
    before = rig.rss_mib()
    cycles = 60
    for _ in range(cycles):
        assert set((await prepare(channel, batch, KUBELET_DEADLINE_S)).values()) == {""}
        assert set((await unprepare(channel, batch, KUBELET_DEADLINE_S)).values()) == {""}
    figures["rss_growth_mib"] = round(rig.rss_mib() - before, 1)
    figures["cycles"] = cycles
    figures["proxy_connections"] = rig.proxy.connections
    log.info("fault figures (API stalls): %s", figures)
    assert figures["rss_growth_mib"] < RSS_GROWTH_LIMIT_MIB
    await channel.close()


# --- kill -9 under 64 concurrent prepares and unprepares -----------------------------------------------


async def test_kill_at_random_moments_loses_nothing_and_never_hands_a_gpu_out_twice(rig: Rig) -> None:
    refs = rig.refs
    figures = {"calls": 0, "kills": 0, "answered_before_kill": 0, "lost": 0}
    prepared: set[str] = set()  # answered as prepared to the "kubelet" and not unprepared since
    rig.start()
    for seed in SEEDS:
        rng = random.Random(seed)
        channel = await rig.channel()
        # 48 prepares and 16 unprepares at once, of different claims: one claim's calls are
        # serialized in either order, so only disjoint sets say what the answers mean.
        order = rng.sample(refs, len(refs))
        order, leaving = order[:48], order[48:]
        preparing = asyncio.create_task(prepare(channel, order, KUBELET_DEADLINE_S))
        unpreparing = asyncio.create_task(unprepare(channel, leaving, KUBELET_DEADLINE_S))
        figures["calls"] += 2
        await asyncio.sleep(rng.uniform(0.0, 0.6))
        rig.plugin.kill()
        figures["kills"] += 1
        for call, results in ((unpreparing, "unprepare"), (preparing, "prepare")):
            try:
                answers = await call
            except grpc.aio.AioRpcError:
                if results == "unprepare":
                    # Killed before it answered, but it may have finished first: those claims' pods
                    # are gone, so their records may or may not be there (the kubelet retries).
                    prepared -= {r.uid for r in leaving}
                continue  # killed before it answered: the kubelet retries
            figures["answered_before_kill"] += 1
            for uid, error in answers.items():
                if results == "unprepare" and not error:
                    prepared.discard(uid)
                elif results == "prepare" and not error:
                    prepared.add(uid)
        await channel.close()
        rig.start()
        channel = await rig.channel()
        assert_node_consistent(rig, prepared)
        # The kubelet's retry: every held GPU goes to the same claim again, no GPU to two claims.
        answers = await prepare(channel, refs, KUBELET_DEADLINE_S)
        figures["calls"] += 1
        granted = [r for r in refs if not answers[r.uid]]
        assert prepared <= {r.uid for r in granted}
        # all 64 asked, eight per GPU: each GPU goes to exactly one of them
        assert sorted(gpu_of(r, refs) for r in granted) == sorted(f"gpu-{i}" for i in range(GPUS))
        assert all("already prepared for claim" in answers[r.uid] for r in refs if r not in granted)
        prepared |= {r.uid for r in granted}
        assert_node_consistent(rig, prepared)
        # Half of them leave (their pods ended), so the next round hands out GPUs again.
        leaving = rng.sample(granted, len(granted) // 2)
        assert set((await unprepare(channel, leaving, KUBELET_DEADLINE_S)).values()) == {""}
        figures["calls"] += 1
        prepared -= {r.uid for r in leaving}
        await channel.close()
    figures["lost"] = len(prepared - set(rig.records()))
    log.info("fault figures (kill -9): %s", figures)
    assert figures["lost"] == 0


async def test_kill_after_the_metadata_write_leaves_nothing_no_claim_holds(rig: Rig) -> None:
    """SIGKILL between a claim's device metadata and its checkpoint record: start-up removes the files
    no record holds, and the kubelet's retry writes them again (crash point after-metadata-write)."""
    ref = rig.refs[0]
    rig.plugin.start(crash_at="after-metadata-write", timeout_s=60)
    channel = await rig.channel()
    with pytest.raises(grpc.aio.AioRpcError):
        await prepare(channel, [ref], KUBELET_DEADLINE_S)
    assert rig.plugin.wait_exit(30) == -9
    await channel.close()
    assert len(rig.metadata()[ref.uid]) == 2  # written: its document and its CDI spec
    assert ref.uid not in rig.records()
    rig.start()
    channel = await rig.channel()
    assert_node_consistent(rig, set())
    assert rig.metadata() == {}
    assert await prepare(channel, [ref], KUBELET_DEADLINE_S) == {ref.uid: ""}
    assert_node_consistent(rig, {ref.uid})
    assert await unprepare(channel, [ref], KUBELET_DEADLINE_S) == {ref.uid: ""}
    assert rig.metadata() == {}
    await channel.close()


# --- corrupt checkpoints ----------------------------------------------------------------------------

CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda raw: raw[:40],
    "empty": lambda raw: b"",
    "garbage": lambda raw: bytes(range(256)) * 4,
    "deeply nested": lambda raw: b"[" * 1000 + b"]" * 1000,
    "very deeply nested": lambda raw: b'{"version": 2, "claims": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "wrong types": lambda raw: b'{"version": 2, "bootId": 7, "claims": {}}',
    "huge number": lambda raw: b'{"version": ' + b"9" * 10_000 + b', "claims": []}',
}


async def test_corrupt_checkpoints_keep_running_claims_and_their_devices(rig: Rig) -> None:
    refs = rig.refs
    a, b = refs[0], refs[GPUS]  # both allocated gpu-0
    rig.start()
    figures = {"shapes": 0, "restarts": 0}
    for shape, corrupt in CORRUPTIONS.items():
        channel = await rig.channel()
        assert (await prepare(channel, [a], KUBELET_DEADLINE_S))[a.uid] == ""
        await channel.close()
        rig.plugin.kill()
        path = rig.plugin.checkpoint_path
        path.write_bytes(corrupt(path.read_bytes()))
        rig.start()
        figures["restarts"] += 1
        channel = await rig.channel()
        assert_node_consistent(rig, {a.uid})
        refused = (await prepare(channel, [b], KUBELET_DEADLINE_S))[b.uid]
        assert "already prepared for claim" in refused, (shape, refused)
        if figures["shapes"] == 0:
            # A recovery followed by an ordinary restart, with the claim still running.
            await channel.close()
            rig.plugin.stop()
            rig.start()
            figures["restarts"] += 1
            channel = await rig.channel()
            assert_node_consistent(rig, {a.uid})
        assert (await unprepare(channel, [a], KUBELET_DEADLINE_S))[a.uid] == ""
        assert rig.specs() == {}
        await channel.close()
        figures["shapes"] += 1
    assert len(list(rig.plugin.state_dir.glob("checkpoint.json.corrupt-*"))) == len(CORRUPTIONS)
    log.info("fault figures (corrupt checkpoints): %s", figures)


# --- names and UIDs at and past the limits; garbage gRPC -------------------------------------------


async def test_names_and_uids_at_and_past_the_limits(rig: Rig) -> None:
    rig.start()
    channel = await rig.channel()
    ns = rig.namespace
    fine = [
        ClaimRef("a" * 63, str(uuid.uuid4()), "no-such-claim"),
        ClaimRef(ns, "u" * 128, "b." * 126 + "b"),
    ]
    refused = [
        ClaimRef("a" * 64, "u-1", "claim"),
        ClaimRef(ns, "u-2", "c" * 254),
        ClaimRef(ns, "u" * 129, "claim"),
        ClaimRef(ns, "u-3", f"x/../../{ns}/resourceclaims/{rig.refs[0].name}"),
        ClaimRef("..", "u-4", "claim"),
        ClaimRef(ns, "../u-5", "claim"),
    ]
    answers = await prepare(channel, [*fine, *refused], KUBELET_DEADLINE_S)
    for ref in fine:
        assert "does not exist" in answers[ref.uid], answers[ref.uid]
    for ref in refused:
        assert "is not a valid ResourceClaim reference" in answers[ref.uid], answers[ref.uid]
    assert set((await unprepare(channel, [*fine, *refused], KUBELET_DEADLINE_S)).values()) == {""}

    # A claim name of the full 253 characters still gets its failure Event.
    holder = rig.refs[1]
    assert (await prepare(channel, [holder], KUBELET_DEADLINE_S))[holder.uid] == ""
    long_name = "l" * 240 + ".x" * 6 + "z"
    long_claim = make_claim(rig.api, ns, rig.node, long_name, 1)
    assert "already prepared" in (await prepare(channel, [long_claim], KUBELET_DEADLINE_S))[long_claim.uid]

    def event() -> dict[str, Any] | None:
        items, _ = rig.api.list(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
        return next((e for e in items if e["regarding"].get("name") == long_name), None)

    posted = wait_for("the DeviceInUse event of the long-named claim", event, 15)
    assert posted["reason"] == "DeviceInUse" and len(posted["metadata"]["name"]) <= 253
    await unprepare(channel, [holder], KUBELET_DEADLINE_S)
    await channel.close()


async def test_garbage_grpc_leaves_the_plugin_serving(rig: Rig) -> None:
    rig.start()
    channel = await rig.channel()
    # No serializers: the frames go on the wire as they are.
    method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    )
    for frame in (b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", bytes(random.Random(5).randbytes(4096))):
        with pytest.raises(grpc.aio.AioRpcError):
            await method(frame, timeout=5)
    dra_socket = next((rig.plugin.kubelet_root_dir / "plugins" / DRIVER).glob("*.sock"))
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 100):
        with socket.socket(socket.AF_UNIX) as raw:
            raw.connect(str(dra_socket))
            raw.sendall(junk)
    ref = rig.refs[2]
    assert (await prepare(channel, [ref], KUBELET_DEADLINE_S))[ref.uid] == ""
    assert (await unprepare(channel, [ref], KUBELET_DEADLINE_S))[ref.uid] == ""
    assert rig.plugin.running
    await channel.close()
