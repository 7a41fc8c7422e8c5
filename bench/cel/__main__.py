"""`python -m bench.cel`: DRA device selector evaluations per second, ours against upstream cel-go.

The fleet varies per device the way real ones do: every device has its own UUID, PCI
address, index and minor number; nodes run one of several driver versions; GPUs that
support MIG are partitioned into MIG devices of several profiles (with their parent's UUID
and PCI address), others are whole GPUs. The selectors read model-level attributes
(product name, architecture, compute capability) and per-device ones (UUID, PCI address,
index, MIG profile, memory).

Both sides evaluate the same selectors over the same devices in this run:

- ours: controller.cel as it runs by default: selectors the fast path covers compiled to a
  Python function over the device JSON (controller.cel.fastpath), cel-expr-python (cel-cpp)
  behind it for every device it does not decide. Raw: compiled once, every device evaluated
  (`matches_uncached`). Effective without memo: compile + raw. Effective: compile from a
  cold cache + `matches` (the compiled function first, then the memo, which keys on the
  values a selector reads, for what it leaves). Printed beside: the share of evaluations
  the compiled functions decide, and the memo's hit rate where cel-expr-python alone runs
  (fast path off), as before it existed.
- cel-go: the celpeer harness (tests/cluster/peers) through k8s.io/dynamic-resource-allocation/cel,
  as kube-scheduler compiles and runs selectors. Raw: compiled once, one DeviceMatches per
  device. Effective: a cold cel.Cache (what the scheduler keeps: compiled programs, no
  result caching) + every evaluation.

Timings on both sides cover compile and evaluation only: the peer's process start and
decoding of its JSON job, and building our device dicts, are outside them. The match sets
(and runtime-error sets) of both sides are compared device by device and must agree.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.peers import PeerError, run_peer
from bench.summary import Row, record
from controller.cel import compile_selector
from controller.cel.errors import EvaluationError
from controller.cel.selector import Selector, clear_caches

DRIVER = "gpu.example.com"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
ENGINE = "cel-expr-python"
PEER = "cel-go (k8s.io/dynamic-resource-allocation/cel v0.37.2)"

# (model, architecture, compute capability, memory, multiprocessors, MIG profiles or none)
MODELS: list[tuple[str, str, str, str, int, list[tuple[str, str]]]] = [
    ("H100", "Hopper", "9.0.0", "80Gi", 132, [("1g.10gb", "10Gi"), ("3g.40gb", "40Gi")]),
    ("H200", "Hopper", "9.0.0", "141Gi", 132, [("1g.18gb", "18Gi"), ("7g.141gb", "141Gi")]),
    ("B200", "Blackwell", "10.0.0", "180Gi", 148, []),
    ("A100", "Ampere", "8.0.0", "80Gi", 108, [("2g.20gb", "20Gi")]),
    ("L40S", "Ada", "8.9.0", "48Gi", 142, []),
    ("L4", "Ada", "8.9.0", "24Gi", 58, []),
]
DRIVER_VERSIONS = ["535.183.6", "550.54.15", "560.35.3", "570.86.10"]
GPUS_PER_NODE = 8

SELECTORS = [
    f'{A}.productName.startsWith("NVIDIA H")',
    f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
    f'{A}.driverVersion.isGreaterThan(semver("550.0.0")) && {A}.architecture in ["Hopper", "Blackwell"]',
    f'{A}.type == "gpu" && {A}.uuid.startsWith("GPU-a")',
    f'{A}.index % 2 == 0 && {A}.pciBusID.endsWith(":00.0")',
    f'{A}.type == "mig" && {A}.profile in ["1g.10gb", "1g.18gb"] && {A}.parentIndex < 4',
    f'cel.bind(cc, {A}.cudaComputeCapability, cc.isGreaterThan(semver("8.0.0")) || cc.major() >= 10)'
    f" && {A}.minor >= 2",
    f'device.driver == "{DRIVER}" && {A}.uuid != "GPU-00000000" && {A}.minor < 64',
]


def _gpu_attributes(
    model: tuple[str, str, str, str, int, list[tuple[str, str]]],
    driver_version: str,
    index: int,
    rng: random.Random,
) -> dict[str, Any]:
    name, arch, cc, memory, _sms, _profiles = model
    return {
        "productName": {"string": f"NVIDIA {name} {memory}"},
        "architecture": {"string": arch},
        "cudaComputeCapability": {"version": cc},
        "driverVersion": {"version": driver_version},
        "index": {"int": index},
        "minor": {"int": index},
        "uuid": {"string": f"GPU-{rng.getrandbits(128):032x}"},
        "pciBusID": {"string": f"0000:{rng.randrange(256):02x}:00.0"},
    }


def fleet(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """`count` devices over nodes of 8 GPUs each; each node one model and one driver version."""
    rng = random.Random(seed)
    devices: list[dict[str, Any]] = []
    node = 0
    while len(devices) < count:
        model = MODELS[rng.randrange(len(MODELS))]
        driver_version = DRIVER_VERSIONS[rng.randrange(len(DRIVER_VERSIONS))]
        _name, _arch, _cc, memory, sms, profiles = model
        for gpu in range(GPUS_PER_NODE):
            attrs = _gpu_attributes(model, driver_version, gpu, rng)
            # On a MIG-capable model, half the GPUs are partitioned (one profile per GPU).
            if profiles and gpu % 2 == 1:
                profile, mig_memory = profiles[rng.randrange(len(profiles))]
                for part in range(2):
                    mig = {k: v for k, v in attrs.items() if k not in ("uuid", "index", "minor")}
                    mig.update({
                        "type": {"string": "mig"},
                        "profile": {"string": profile},
                        "uuid": {"string": f"MIG-{rng.getrandbits(128):032x}"},
                        "parentUUID": attrs["uuid"],
                        "parentIndex": attrs["index"],
                        "index": {"int": part},
                        "minor": {"int": 64 + gpu * 8 + part},
                    })  # fmt: skip
                    devices.append({
                        "name": f"node{node}-gpu-{gpu}-mig-{part}",
                        "attributes": mig,
                        "capacity": {"memory": {"value": mig_memory}},
                    })  # fmt: skip
            else:
                devices.append({
                    "name": f"node{node}-gpu-{gpu}",
                    "attributes": {**attrs, "type": {"string": "gpu"}},
                    "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": str(sms)}},
                })  # fmt: skip
        node += 1
    return devices[:count]


def outcomes(selector: Selector, devices: list[dict[str, Any]], cached: bool) -> tuple[list[int], list[int]]:
    """Indexes of the devices the selector matches, and of those it fails on."""
    evaluate = selector.matches if cached else selector.matches_uncached
    matched, failed = [], []
    for i, device in enumerate(devices):
        try:
            if evaluate(DRIVER, device):
                matched.append(i)
        except EvaluationError:
            failed.append(i)
    return matched, failed


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def ours_raw(devices: list[dict[str, Any]]) -> float:
    compiled = [compile_selector(e, engine=ENGINE) for e in SELECTORS]
    return timed(lambda: [outcomes(s, devices, cached=False) for s in compiled])


def ours_effective(devices: list[dict[str, Any]], memo: bool) -> float:
    def work() -> None:
        clear_caches()
        for expression in SELECTORS:
            outcomes(compile_selector(expression, engine=ENGINE), devices, cached=memo)

    return timed(work)


class CountingProgram:
    """Stands in for a selector's compiled program to count real evaluations (memo misses)."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self.calls = 0

    def evaluate(self, driver: str, device: Any) -> bool:
        self.calls += 1
        result: bool = self.program.evaluate(driver, device)
        return result


def memo_hit_rate(devices: list[dict[str, Any]]) -> float:
    """Share of `matches` calls answered from the memo, over one cold pass of every selector,
    with the fast path off (with it on, the memo sees only what the compiled function leaves)."""
    clear_caches()
    evaluations = 0
    for expression in SELECTORS:
        selector = compile_selector(expression, engine=ENGINE)
        counter = CountingProgram(selector._program)  # the memo itself is what is measured
        selector._program = counter
        selector._fast = None
        outcomes(selector, devices, cached=True)
        evaluations += counter.calls
    clear_caches()
    return 1 - evaluations / (len(SELECTORS) * len(devices))


def compiled_share(devices: list[dict[str, Any]]) -> float:
    """Share of evaluations the compiled functions decide themselves (no engine call)."""
    clear_caches()
    evaluations = 0
    for expression in SELECTORS:
        selector = compile_selector(expression, engine=ENGINE)
        counter = CountingProgram(selector._program)
        selector._program = counter
        outcomes(selector, devices, cached=False)
        evaluations += counter.calls
    clear_caches()
    return 1 - evaluations / (len(SELECTORS) * len(devices))


def compare(
    ours: list[tuple[list[int], list[int]]], peer_matches: list[list[int]], peer_errors: list[list[int]]
) -> int:
    """Devices on which the two sides disagree (match, no match or error), over every selector."""
    mismatches = 0
    for (matched, failed), p_matched, p_failed in zip(ours, peer_matches, peer_errors, strict=True):
        mismatches += len(set(matched) ^ set(p_matched)) + len(set(failed) ^ set(p_failed))
    return mismatches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cel", description=__doc__)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure; the fastest counts")
    args = parser.parse_args(argv)
    devices = fleet(args.devices)
    evaluations = len(SELECTORS) * len(devices)

    try:
        peer = run_peer(
            "celpeer", {"driver": DRIVER, "selectors": SELECTORS, "devices": devices, "runs": args.runs}
        )
    except PeerError as err:
        print(f"bench.cel: {err}", file=sys.stderr)
        return 1
    ours_sets = [outcomes(compile_selector(e, engine=ENGINE), devices, cached=False) for e in SELECTORS]
    memo_sets = [outcomes(compile_selector(e, engine=ENGINE), devices, cached=True) for e in SELECTORS]
    mismatches = compare(ours_sets, peer["matches"], peer["errors"])
    memo_mismatches = compare(memo_sets, peer["matches"], peer["errors"])

    # The three figures of ours are measured in turn within each run, so that load from other
    # work on the machine falls on all of them alike; the fastest run of each counts.
    rounds = [
        (ours_raw(devices), ours_effective(devices, memo=False), ours_effective(devices, memo=True))
        for _ in range(max(args.runs, 1))
    ]
    raw, effective_plain, effective_memo = (evaluations / min(column) for column in zip(*rounds, strict=True))
    hit_rate = memo_hit_rate(devices)
    share = compiled_share(devices)
    peer_raw = evaluations / peer["raw_seconds"]
    peer_effective = evaluations / peer["effective_seconds"]

    kinds = sorted({d["attributes"]["type"]["string"] for d in devices})
    print(
        f"{len(devices)} devices ({', '.join(kinds)}; {len(MODELS)} models, "
        f"{len(DRIVER_VERSIONS)} driver versions), {len(SELECTORS)} selectors, {evaluations} evaluations"
    )
    print(
        f"matches per selector: {[len(m) for m, _ in ours_sets]}; "
        f"runtime errors: {[len(e) for _, e in ours_sets]}"
    )
    print(f"devices where ours and cel-go disagree: {mismatches} (with the memo: {memo_mismatches})")
    print(
        f"{'evaluations/s':<44} {'ours (fast path, ' + ENGINE + ')':>34} {'cel-go':>12} {'ours/cel-go':>12}"
    )
    figures = [
        ("raw (compiled once, every device)", raw, peer_raw),
        ("effective, no memo (compile + every device)", effective_plain, peer_effective),
        ("effective, memo (compile + memoized)", effective_memo, peer_effective),
    ]
    for label, ours_rate, peer_rate in figures:
        print(f"{label:<44} {ours_rate:>34,.0f} {peer_rate:>12,.0f} {ours_rate / peer_rate:>11.2f}x")
        record(Row("cel", label, "evals/s", ours_rate, peer_rate, PEER, higher_is_better=True))
    print(
        f"evaluations decided by the compiled Python functions: {share:.1%}; memo hit rate with"
        f" cel-expr-python alone (fast path off): {hit_rate:.1%}; cel-go caches compiled programs only"
    )
    if mismatches or memo_mismatches:
        print("bench.cel: ours and cel-go disagree on the match sets", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
