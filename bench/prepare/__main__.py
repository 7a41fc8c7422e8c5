"""`python -m bench.prepare`: our plugin against the dra-example-driver kubelet plugin, side by side.

Both run as processes against the same real API server (bench.controlplane), each with its own
driver name and node (= pool), on fresh claims whose `status.allocation` names its own devices,
one claim per device; the same client (bench/prepare/drive.py) drives both over their DRA
sockets at concurrency 1 and 64, then unprepares. Batches alternate between the plugins so
that whatever else the machine does falls on both alike. Then: RSS after the runs, the
exclusive-device check (ours refuses a second claim on an exclusive device; the peer prepares
it), the "one blocked claim" case through bench/prepare/claimdelay.py, start-up, and RSS at
8, 64 and 8,000 devices. Sizes: BENCH_PREPARE_DEVICES (64), BENCH_PREPARE_BATCHES (4).

Beside the peer, two floors (bench/plugin_floor.py) show what is Python's: the bare script serving
the two sockets (start-up and RSS), and the same script first importing every module outside the
project that ours had imported once published (RSS: ours less its own modules and their state).
At 64 concurrent, ours' event loop thread's CPU per claim and its share of the wall are printed
too: all of ours' Python runs on that one thread, the peer's goroutines on every core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from textwrap import indent

from bench.controlplane import start_control_plane
from bench.prepare.claimdelay import ClaimDelayProxy
from bench.prepare.claims import allocated_claim, claim_batches, create_node
from bench.prepare.drive import DraClient, PrepareFailed, percentile, run_batch
from bench.prepare.plugins import (
    FLOOR_NAME,
    IMPORTS_FLOOR_NAME,
    PEER_BINARY,
    PEER_NAME,
    OurPlugin,
    PeerPlugin,
    Plugin,
    floor_runs,
    modules_imported,
)
from bench.summary import Row, record, record_failure
from devcluster.binaries import REPO_ROOT
from devcluster.controlplane import ControlPlane
from devcluster.objects import create_namespace
from dracommon.kubeapi import KubeApi

DEVICES = int(os.environ.get("BENCH_PREPARE_DEVICES", "64"))
BATCHES = int(os.environ.get("BENCH_PREPARE_BATCHES", "4"))
CONCURRENT = 64
BLOCK_DELAY_S = 1.0
BLOCK_ROUNDS = 2
RSS_SIZES = tuple(int(n) for n in os.environ.get("BENCH_PREPARE_RSS_SIZES", "8,64,8000").split(","))
# Starts to both sockets per side and size, the median shown: one start, on shared cores, was
# seen anywhere from 0.07 to 0.17 s for the same code (the floor's as much).
START_REPEATS = int(os.environ.get("BENCH_PREPARE_START_REPEATS", "7"))
OURS_DRIVER, PEER_DRIVER = "gpu.bench-ours.draplugin.dev", "gpu.bench-peer.example.com"
OURS_NODE, PEER_NODE = "bench-ours", "bench-peer"


def peer_binary() -> Path:
    """The example driver from tests/cluster/build_peers.sh (the dir `make bench` passes, or built now)."""
    bin_dir = os.environ.get("DRA_PEERS_BIN_DIR")
    if not bin_dir:
        script = REPO_ROOT / "tests" / "cluster" / "build_peers.sh"
        bin_dir = subprocess.run([str(script)], check=True, stdout=subprocess.PIPE, text=True).stdout.split()[
            -1
        ]
    return Path(bin_dir) / PEER_BINARY


def row(figure: str, unit: str, ours: float, peer: float, *, higher_is_better: bool = False) -> None:
    ratio = f"{ours / peer:.2f}x" if peer else "n/a"
    print(f"  {figure}: ours {ours:.4g} {unit}, {PEER_NAME} {peer:.4g} {unit}, ours/peer {ratio}")
    record(Row("prepare", figure, unit, ours, peer, PEER_NAME, higher_is_better))


def floor_row(figure: str, unit: str, ours: float, floor: float, name: str = FLOOR_NAME) -> None:
    """Ours beside the bare grpc.aio script (bench/plugin_floor.py): what Python + asyncio + grpc
    cost on their own, so ours/floor is the part of the figure that is the plugin's own; or beside
    that script importing everything ours imports but its own modules (`name` says which)."""
    print(f"  {figure}: ours {ours:.4g} {unit}, floor {floor:.4g} {unit}, ours/floor {ours / floor:.2f}x")
    record(Row("prepare", figure, unit, ours, floor, name))


def plugin_imports(rest: KubeApi, root: Path, kubeconfig: Path) -> Path:
    """One more start of ours, untimed, under `-X importtime` until it has published its smallest
    inventory: the modules outside the project it imported by then, written one per line to a file
    for the floor's `--imports` (the floor of the rows `... vs the floor importing what ours imports`)."""
    size = min(RSS_SIZES)
    plugin = OurPlugin(
        "ours", OURS_DRIVER, OURS_NODE, root / "imports", size, kubeconfig, profile_imports=True
    )
    try:
        started = plugin.start(rest, publish_timeout_s=120.0)
        if started.published_s is None:
            raise RuntimeError(f"ours under -X importtime did not publish: {started.publish_error}")
    finally:
        plugin.stop()
        plugin.delete_slices(rest)
    modules = modules_imported(plugin.log_path.read_text(errors="replace"))
    if not modules:
        raise RuntimeError(f"no -X importtime lines in {plugin.log_path}")
    listed = root / "imports" / "modules.txt"
    listed.write_text("".join(f"{name}\n" for name in modules))
    print(f"  ours, once published, had imported {len(modules)} modules outside the project ({listed})")
    return listed


def ms(seconds: float) -> float:
    return seconds * 1e3


async def latency_runs(rest: KubeApi, namespace: str, ours: Plugin, peer: Plugin) -> None:
    """Concurrency 1 and 64 on fresh claims, batches alternating between the plugins."""
    clients = {p.label: DraClient(p.dra_socket) for p in (ours, peer)}
    try:
        for concurrency in (1, CONCURRENT):
            latencies: dict[str, list[float]] = {"ours": [], "peer": []}
            walls: dict[str, float] = {"ours": 0.0, "peer": 0.0}
            # Each plugin's own CPU over its timed prepares (all its threads, not the unprepares
            # after them): on two cores that the API server and the client share, a figure that
            # the other processes' bursts move less than the times.
            cpu: dict[str, float] = {"ours": 0.0, "peer": 0.0}
            loop_cpu = 0.0  # ours' main thread alone: its event loop
            batches = {
                p.label: claim_batches(
                    rest,
                    namespace,
                    f"{p.label}-c{concurrency}",
                    p.driver,
                    p.node,
                    batches=BATCHES + 1,
                    devices=DEVICES,
                )
                for p in (ours, peer)
            }
            for b in range(BATCHES + 1):
                for p in (ours, peer) if b % 2 == 0 else (peer, ours):
                    loop = p.main_thread_cpu_s if p is ours else None
                    batch = await run_batch(
                        clients[p.label], batches[p.label][b], concurrency, cpu_s=p.cpu_s, loop_cpu_s=loop
                    )
                    if b == 0:
                        continue  # warm-up: connections, first files, caches
                    latencies[p.label].extend(batch.latencies)
                    walls[p.label] += batch.wall_s
                    cpu[p.label] += batch.cpu_s
                    loop_cpu += batch.loop_cpu_s
            label = "1 at a time" if concurrency == 1 else f"{concurrency} concurrent"
            print(f"prepare, {label}, {BATCHES} batches of {DEVICES} fresh claims each:")
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                row(
                    f"prepare {label} {name}",
                    "ms",
                    ms(percentile(latencies["ours"], q)),
                    ms(percentile(latencies["peer"], q)),
                )
            row(
                f"claims/s {label}",
                "claims/s",
                len(latencies["ours"]) / walls["ours"],
                len(latencies["peer"]) / walls["peer"],
                higher_is_better=True,
            )
            row(
                f"plugin CPU per prepared claim {label}",
                "ms",
                ms(cpu["ours"] / len(latencies["ours"])),
                ms(cpu["peer"] / len(latencies["peer"])),
            )
            # Where the time goes, not a comparison: all of ours' Python runs on its one event
            # loop thread (the GIL), while the peer's goroutines run on every core.
            claims = len(latencies["ours"])
            print(
                f"  ours' event loop thread on a CPU: {ms(loop_cpu / claims):.3g} ms per claim, "
                f"{loop_cpu / walls['ours']:.0%} of the batches' wall time; cores used (CPU / wall): "
                f"ours {cpu['ours'] / walls['ours']:.2f}, peer {cpu['peer'] / walls['peer']:.2f}"
            )
    finally:
        for client in clients.values():
            await client.close()


async def exclusive_check(rest: KubeApi, namespace: str, plugin: Plugin) -> str:
    """Two claims allocated the same exclusive device: what the plugin answers to the second."""
    first = allocated_claim(rest, namespace, f"{plugin.label}-excl-a", plugin.driver, plugin.node, "gpu-0")
    second = allocated_claim(rest, namespace, f"{plugin.label}-excl-b", plugin.driver, plugin.node, "gpu-0")
    client = DraClient(plugin.dra_socket)
    try:
        if error := await client.prepare(first):
            return f"the first claim failed: {error}"
        error = await client.prepare(second)
        await client.unprepare(first)
        if not error:
            await client.unprepare(second)
            return "prepared both claims on gpu-0"
        return f"refused the second claim on gpu-0: {error[:160]}"
    finally:
        await client.close()


async def blocked_runs(
    rest: KubeApi, namespace: str, plugin: Plugin, proxy: ClaimDelayProxy
) -> tuple[float, float, float]:
    """The others' p99 at concurrency 64 without and with one claim's GET held BLOCK_DELAY_S
    (BLOCK_ROUNDS batches of each, alternating), and the blocked claims' median latency."""
    batches = claim_batches(
        rest, namespace, f"{plugin.label}-blk", plugin.driver, plugin.node, batches=1 + 2 * BLOCK_ROUNDS,
        devices=DEVICES,
    )  # fmt: skip
    client = DraClient(plugin.dra_socket)
    free: list[float] = []
    held: list[float] = []
    victims: list[float] = []
    try:
        await run_batch(client, batches[0], CONCURRENT)  # warm-up through the proxy
        for r in range(BLOCK_ROUNDS):
            free.extend((await run_batch(client, batches[1 + 2 * r], CONCURRENT)).latencies)
            victim = batches[2 + 2 * r][0]
            proxy.block(victim.namespace, victim.name)
            delayed_before = proxy.delayed
            try:
                # The blocked claim goes first, so every other call arrives while it is held.
                latencies = (await run_batch(client, batches[2 + 2 * r], CONCURRENT)).latencies
            finally:
                proxy.block(None)
            if proxy.delayed == delayed_before:
                raise RuntimeError(f"{plugin.label}: the proxy never saw the blocked claim's GET")
            victims.append(latencies[0])
            held.extend(latencies[1:])
        return ms(percentile(free, 0.99)), ms(percentile(held, 0.99)), ms(percentile(victims, 0.5))
    finally:
        await client.close()


def rss_by_size(rest: KubeApi, root: Path, kubeconfig: Path, binary: Path) -> None:
    imports = plugin_imports(rest, root, kubeconfig)
    for size in RSS_SIZES:
        sides = (
            OurPlugin("ours", OURS_DRIVER, OURS_NODE, root / f"ours-{size}", size, kubeconfig),
            PeerPlugin(
                "peer", PEER_DRIVER, PEER_NODE, root / f"peer-{size}", size, kubeconfig, binary=binary
            ),
        )
        rss: dict[str, float] = {}
        starts = {}
        sockets_s: dict[str, float] = {}
        for plugin in sides:
            started = plugin.start(rest, publish_timeout_s=120.0)
            time.sleep(0.5)  # settle after the publish
            rss[plugin.label] = plugin.rss_mib() if plugin.running else 0.0
            starts[plugin.label] = started
            published = plugin.published(rest)
            plugin.stop()
            plugin.delete_slices(rest)
            if started.published_s is not None:
                more = [plugin.sockets_only() for _ in range(START_REPEATS - 1)]
                plugin.delete_slices(rest)
                every = [started.sockets_s, *more]
                sockets_s[plugin.label] = statistics.median(every)
                shown = " ".join(f"{t:.3f}" for t in every)
                print(f"  {plugin.label}, {size} devices, starts to sockets (s): {shown}")
            if started.published_s is None:
                print(
                    f"  {plugin.label} did not publish {size} devices (published {published}): "
                    f"{started.publish_error}"
                )
        ours_s, peer_s = starts["ours"], starts["peer"]
        if peer_s.published_s is None or ours_s.published_s is None:
            shown = ", ".join(
                f"{label} {value:.1f} MiB"
                + (f", published in {starts[label].published_s:.1f} s" if starts[label].published_s else "")
                if value
                else f"{label} exited"
                for label, value in rss.items()
            )
            print(f"  RSS at {size} devices: {shown} (not compared: not both published all {size} devices)")
            continue
        row(f"RSS at {size} devices, published", "MiB", rss["ours"], rss["peer"])
        # The median of START_REPEATS starts each (the published start and more to the sockets).
        row(f"start to sockets ready, {size} devices", "s", sockets_s["ours"], sockets_s["peer"])
        row(f"start to slices published, {size} devices", "s", ours_s.published_s, peer_s.published_s)
        floor_s, floor_rss = floor_runs(root / f"floor-{size}", START_REPEATS)
        floor_row(f"start to sockets ready, {size} devices, vs the floor", "s", sockets_s["ours"], floor_s)
        floor_row(f"RSS at {size} devices, published, vs the floor", "MiB", rss["ours"], floor_rss)
        # RSS only: that floor imports before its sockets what ours imports behind them.
        _, imports_rss = floor_runs(
            root / f"floor-imports-{size}", 1, imports=imports, label="floor importing what ours imports"
        )
        floor_row(
            f"RSS at {size} devices, published, vs the floor importing what ours imports",
            "MiB",
            rss["ours"],
            imports_rss,
            IMPORTS_FLOOR_NAME,
        )


PARTS = ("latency", "exclusive", "blocked", "rss")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prepare",
        description="Our kubelet plugin against the dra-example-driver plugin, side by side "
        "(sizes: BENCH_PREPARE_DEVICES, BENCH_PREPARE_BATCHES, BENCH_PREPARE_RSS_SIZES).",
    )
    parser.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        dest="parts",
        help="run only this part (repeat for more; default: all): latency = start-up, concurrency 1 "
        "and 64, RSS after; exclusive = the exclusive-device check; blocked = one claim's GET held by "
        "a proxy; rss = memory and start-up by inventory size",
    )
    args = parser.parse_args(argv)
    args.parts = tuple(args.parts or PARTS)
    return args


class Failures:
    """Parts that failed: each said at once, with the side and why, and the run goes on to the next."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def note(self, part: str, side: str, err: BaseException) -> None:
        why = f"{type(err).__name__}: {err}" if not isinstance(err, PrepareFailed) else str(err)
        line = f"{part}, {side}: {why}"
        self.seen.append(line)
        print(f"  FAILED {line}", flush=True)
        record_failure("prepare", part, side, why)


def blocked_part(
    rest: KubeApi,
    namespace: str,
    cluster: ControlPlane,
    root: Path,
    plugins: list[Plugin],
    failures: Failures,
) -> None:
    """Each plugin alone through the claim-delay proxy; a side that fails is named, the other still runs."""
    proxy = ClaimDelayProxy(
        int(cluster.server.rsplit(":", 1)[1]), cluster.ca_file, root / "proxy-pki", delay_s=BLOCK_DELAY_S
    )
    try:
        proxied = proxy.kubeconfig(cluster.kubeconfig, root / "proxy-kubeconfig")
        print(f"one blocked claim (its GET held {BLOCK_DELAY_S:.1f} s by a proxy both plugins go through):")
        blocked: dict[str, tuple[float, float, float]] = {}
        for p in plugins:
            direct = p.kubeconfig
            p.kubeconfig = proxied
            try:
                started = p.start(rest)
                if started.published_s is None:
                    raise RuntimeError(f"did not publish through the proxy: {started.publish_error}")
                proxy.reset_stats()
                blocked[p.label] = asyncio.run(blocked_runs(rest, namespace, p, proxy))
            except Exception as err:  # one side's failure must not cost the other side's figures
                failures.note("one blocked claim", p.label, err)
                print(f"    the proxy saw: {proxy.reset_stats().summary()}")
                print(f"    {p.label}'s log ({p.log_path}), last lines:\n{indent(p.log_tail(8), '      ')}")
                continue
            finally:
                p.stop()
                p.kubeconfig = direct
            free, held, victim = blocked[p.label]
            print(f"  {p.label}: others' p99 {free:.1f} ms without, {held:.1f} ms with it; "
                  f"the blocked claim itself {victim:.0f} ms (median)")  # fmt: skip
            print(f"    the proxy saw: {proxy.reset_stats().summary()}")
        if len(blocked) == len(plugins):
            ours, peer = blocked["ours"], blocked["peer"]
            row("others' p99 at 64 concurrent, no claim blocked", "ms", ours[0], peer[0])
            row("others' p99 at 64 concurrent, one claim blocked", "ms", ours[1], peer[1])
        for p in plugins:
            p.delete_slices(rest)
    finally:
        proxy.close()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    binary = peer_binary()
    if not binary.exists():
        print(f"bench.prepare: {binary} is missing (tests/cluster/build_peers.sh builds it)", file=sys.stderr)
        return 1
    cluster = start_control_plane("bench-prepare-")
    if cluster is None:
        return 1
    # SIGTERM (a timeout, ^C from make) ends the run through the finally below: no plugin outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = cluster.state_dir / "p"
    plugins: list[Plugin] = []
    failures = Failures()
    try:
        with cluster.api_client() as api:
            rest = KubeApi(api)
            namespace = create_namespace(api, prefix="bench-")
            for node in (OURS_NODE, PEER_NODE):
                create_node(rest, node)
            ours = OurPlugin("ours", OURS_DRIVER, OURS_NODE, root / "ours", DEVICES, cluster.kubeconfig)
            peer = PeerPlugin(
                "peer", PEER_DRIVER, PEER_NODE, root / "peer", DEVICES, cluster.kubeconfig, binary=binary
            )
            plugins = [ours, peer]
            if "latency" in args.parts or "exclusive" in args.parts:
                direct_parts(rest, namespace, plugins, args.parts, failures)
            if "blocked" in args.parts:
                blocked_part(rest, namespace, cluster, root, plugins, failures)
            if "rss" in args.parts:
                print("memory and start-up by inventory size (each plugin alone, after it published):")
                try:
                    rss_by_size(rest, root, cluster.kubeconfig, binary)
                except Exception as err:
                    failures.note("memory and start-up by inventory size", "either", err)
    finally:
        for p in plugins:
            p.stop()
        cluster.stop()
    if failures.seen:
        print(
            "bench.prepare: failed parts:\n" + "\n".join(f"  {line}" for line in failures.seen),
            file=sys.stderr,
        )
        return 1
    return 0


def direct_parts(
    rest: KubeApi, namespace: str, plugins: list[Plugin], parts: tuple[str, ...], failures: Failures
) -> None:
    """Start-up, the latency runs and the exclusive check, both plugins talking to the API server directly."""
    ours, peer = plugins
    print(f"starting both plugins with {DEVICES} fake GPUs each ...", flush=True)
    try:
        started = {p.label: p.start(rest) for p in plugins}
        for p in plugins:
            if started[p.label].published_s is None:
                raise RuntimeError(f"{p.label} did not publish: {started[p.label].publish_error}")
    except Exception as err:
        failures.note("start-up", "either", err)
        for p in plugins:
            p.stop()
        return
    try:
        print(f"start-up, {DEVICES} devices:")
        # The first start of each in this run: cold caches (and, for ours, any stale bytecode).
        row("first start to sockets ready", "s", started["ours"].sockets_s, started["peer"].sockets_s)
        row(
            "first start to slices published",
            "s",
            started["ours"].published_s or 0.0,
            started["peer"].published_s or 0.0,
        )
        if "latency" in parts:
            try:
                asyncio.run(latency_runs(rest, namespace, ours, peer))
                print("memory:")
                row("RSS after the latency runs", "MiB", ours.rss_mib(), peer.rss_mib())
            except Exception as err:
                failures.note("prepare latency", "either", err)
        if "exclusive" in parts:
            print("the exclusive-device check (two claims allocated gpu-0; not a timing):")
            for p in plugins:
                try:
                    print(f"  {p.label}: {asyncio.run(exclusive_check(rest, namespace, p))}")
                except Exception as err:
                    failures.note("exclusive-device check", p.label, err)
    finally:
        for p in plugins:
            p.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
