"""The fault suite, kubelet side: the plugin's gRPC service under a stalled API server and huge calls.

`draplugin run` as its own process with per-pod sockets (`POD_UID`, as the chart always sets it, so
prepare and unprepare take the node-wide lock of rolling updates), behind `tests.faultproxy`:

- an unprepare while prepares wait on a stalled API server is answered at once: the lock is not
  held across API reads, so the answer does not depend on how long the stall lasts;
- a call of 40,000 claims (2.2 MiB, under gRPC's 4 MiB cap) runs only the first
  `MAX_CLAIMS_PER_CALL` and answers every other with a per-claim error, the plugin's memory stays
  bounded over repeated such calls, and another caller is served meanwhile.

The rig (plugin process, proxy, claims) is the one of `test_faults_plugin`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devcluster.controlplane import ControlPlane
from devcluster.plugin import PluginProcess
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin.kubelet.dra import MAX_CLAIMS_PER_CALL, TOO_MANY_CLAIMS
from draplugin.kubelet.interface import ClaimRef
from draplugin.kubelet.sockets import socket_paths
from tests.faultrig import proxied_plugin
from tests.integration.test_faults_plugin import GPUS, KUBELET_DEADLINE_S, Rig, make_claim, prepare, unprepare

pytestmark = pytest.mark.cluster

log = logging.getLogger(__name__)

# The plugin's --prepare-api-deadline here: a stall lasts this long for a prepare, far longer than
# an unprepare may take, so an unprepare that waited behind one cannot pass.
STALL_S = 30.0
HUGE = 40_000
# RSS growth allowed over repeated 40,000-claim calls: the request and the answer (a few MiB each as
# protobuf objects) are transient. Unbounded, 10,000-claim calls grew RSS by 137 MiB.
RSS_GROWTH_LIMIT_MIB = 40.0


class PerPodPluginProcess(PluginProcess):
    """The plugin with per-pod sockets (`POD_UID` in its environment): start waits for those."""

    @property
    def registration_socket(self) -> Path:
        return socket_paths(self.kubelet_root_dir, self.driver_name, self.extra_env["POD_UID"]).registration


@pytest.fixture(scope="module")
def parts(kube_cluster: ControlPlane) -> Iterator[tuple[KubeApi, str, str, list[ClaimRef]]]:
    """A node, a namespace and one claim per GPU."""
    from devcluster.objects import create_fake_node, create_namespace, delete_fake_node, delete_namespace

    with kube_cluster.api_client() as client:
        api = KubeApi(client)
        node = f"calls-{uuid.uuid4().hex[:6]}"
        create_fake_node(client, node)
        namespace = create_namespace(client)
        try:
            yield (
                api,
                node,
                namespace,
                [make_claim(api, namespace, node, f"claim-{i}", i) for i in range(GPUS)],
            )
        finally:
            delete_namespace(client, namespace)
            delete_fake_node(client, node)


@pytest.fixture
def rig(kube_cluster: ControlPlane, parts: tuple[KubeApi, str, str, list[ClaimRef]]) -> Iterator[Rig]:
    api, node, namespace, refs = parts
    root, proxy, plugin = proxied_plugin(
        kube_cluster,
        node,
        prefix="flk-",
        gpus_yaml=f"gpus:\n  - model: A100-SXM4-40GB\n    count: {GPUS}\n",
        api_deadline_s=STALL_S,
        plugin_class=PerPodPluginProcess,
        # Per-pod sockets, as the chart runs the plugin: calls take the node-wide lock.
        extra_env={"POD_UID": str(uuid.uuid4())},
    )
    rig = Rig(api, node, namespace, root, proxy, plugin, refs)
    try:
        yield rig
    finally:
        proxy.set_mode("pass")
        plugin.stop()
        proxy.close()
        log.info("plugin log tail:\n%s", plugin.log_tail(20))
        shutil.rmtree(root, ignore_errors=True)


async def timed_unprepare(channel: grpc.aio.Channel, refs: list[ClaimRef]) -> float:
    started = time.monotonic()
    assert set((await unprepare(channel, refs, KUBELET_DEADLINE_S)).values()) == {""}
    return time.monotonic() - started


async def stalled_reads(rig: Rig, held_before: int) -> None:
    """Until the plugin's API traffic is held by the proxy (a read is in flight and stalled)."""
    await asyncio.to_thread(
        wait_for, "a held API read", lambda: rig.proxy.held_chunks > held_before, 30, 0.02
    )


async def test_unprepare_during_an_api_stall_under_per_pod_sockets_answers_at_once(rig: Rig) -> None:
    rig.start()
    channel = await rig.channel()
    staying, leaving = rig.refs[: GPUS // 2], rig.refs[GPUS // 2 :]
    assert set((await prepare(channel, leaving, KUBELET_DEADLINE_S)).values()) == {""}
    # What an unprepare costs on this machine now, with nothing in its way: the margin scales with it.
    baseline_s = await timed_unprepare(channel, leaving)
    assert set((await prepare(channel, leaving, KUBELET_DEADLINE_S)).values()) == {""}
    margin_s = 2.0 + 10 * baseline_s
    assert margin_s < STALL_S / 3, f"the machine is too slow to tell a wait from a stall: {margin_s:.1f}s"

    held = rig.proxy.held_chunks
    rig.proxy.set_mode("hold")
    stuck = asyncio.create_task(prepare(channel, staying, KUBELET_DEADLINE_S))
    await stalled_reads(rig, held)
    took_s = await timed_unprepare(channel, leaving)
    log.info("unprepare during a %gs stall: %.2fs (baseline %.3fs)", STALL_S, took_s, baseline_s)
    assert took_s < margin_s
    assert not stuck.done()
    rig.proxy.set_mode("pass")
    await stuck  # answered (with errors, past the stall); the plugin serves on
    assert set((await prepare(channel, staying, KUBELET_DEADLINE_S)).values()) == {""}
    assert set((await unprepare(channel, staying, KUBELET_DEADLINE_S)).values()) == {""}
    await channel.close()


async def test_a_40000_claim_call_is_bounded_in_work_and_memory_and_others_are_served(rig: Rig) -> None:
    rig.start()
    channel = await rig.channel()
    other = await rig.channel()  # another caller (the kubelet for another pod), its own connection
    huge = [ClaimRef(rig.namespace, str(uuid.uuid4()), f"huge-{i}") for i in range(HUGE)]
    ours = rig.refs[:2]
    assert set((await prepare(other, ours, KUBELET_DEADLINE_S)).values()) == {""}

    # Warm up once (the first huge call allocates what any later one reuses), then measure.
    answers = await prepare(channel, huge, KUBELET_DEADLINE_S)
    past = [r.uid for r in huge[MAX_CLAIMS_PER_CALL:]]
    assert {answers[uid] for uid in past} == {TOO_MANY_CLAIMS}
    # The first ones ran: they do not exist in the API server.
    assert all("does not exist" in answers[r.uid] for r in huge[:MAX_CLAIMS_PER_CALL])
    before = rig.rss_mib()
    for _ in range(3):
        answers = await unprepare(channel, huge, KUBELET_DEADLINE_S)
        assert {answers[uid] for uid in past} == {TOO_MANY_CLAIMS}
        assert {answers[r.uid] for r in huge[:MAX_CLAIMS_PER_CALL]} == {""}
        await prepare(channel, huge, KUBELET_DEADLINE_S)
    growth = rig.rss_mib() - before
    log.info("RSS %.1f MiB before, growth %.1f MiB over 6 calls of %d claims", before, growth, HUGE)
    assert growth < RSS_GROWTH_LIMIT_MIB
    assert rig.plugin.running

    # Another caller meanwhile: a huge prepare whose reads stall, and an unprepare served beside it.
    held = rig.proxy.held_chunks
    rig.proxy.set_mode("hold")
    stuck = asyncio.create_task(prepare(channel, huge, KUBELET_DEADLINE_S))
    await stalled_reads(rig, held)
    started = time.monotonic()
    assert set((await unprepare(other, ours, KUBELET_DEADLINE_S)).values()) == {""}
    served_s = time.monotonic() - started
    log.info("another caller served in %.2fs beside a stalled 40,000-claim call", served_s)
    assert served_s < STALL_S / 3
    assert not stuck.done()
    rig.proxy.set_mode("pass")
    answers = await stuck
    assert {answers[uid] for uid in past} == {TOO_MANY_CLAIMS}
    await channel.close()
    await other.close()
