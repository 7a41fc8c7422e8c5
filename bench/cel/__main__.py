"""`python -m bench.cel`: evaluations per second of DRA device selectors.

10,000 devices of 8 GPU models (identical within a model except name, UUID, index and
PCI address) and 5 DeviceClass-style selectors. Prints, per engine, the raw evaluation
rate (no memoization) and the effective rate of `Selector.matches` (compile + memoized
evaluation over the fleet), all as ratios against raw cel-expr-python from this run.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from controller.cel import compile_selector
from controller.cel.selector import Selector, clear_caches

DRIVER = "gpu.example.com"
A = 'device.attributes["gpu.example.com"]'
C = 'device.capacity["gpu.example.com"]'

MODELS: list[dict[str, Any]] = [
    {"model": "H100", "arch": "Hopper", "cc": "9.0.0", "memory": "80Gi", "sms": 132},
    {"model": "H200", "arch": "Hopper", "cc": "9.0.0", "memory": "141Gi", "sms": 132},
    {"model": "B200", "arch": "Blackwell", "cc": "10.0.0", "memory": "180Gi", "sms": 148},
    {"model": "A100", "arch": "Ampere", "cc": "8.0.0", "memory": "80Gi", "sms": 108},
    {"model": "A100", "arch": "Ampere", "cc": "8.0.0", "memory": "40Gi", "sms": 108},
    {"model": "L40S", "arch": "Ada", "cc": "8.9.0", "memory": "48Gi", "sms": 142},
    {"model": "L4", "arch": "Ada", "cc": "8.9.0", "memory": "24Gi", "sms": 58},
    {"model": "T4", "arch": "Turing", "cc": "7.5.0", "memory": "16Gi", "sms": 40},
]

SELECTORS = [
    f'{A}.model == "H100"',
    f'{C}.memory.compareTo(quantity("64Gi")) >= 0',
    f'{A}.driverVersion.isGreaterThan(semver("550.0.0")) && {A}.architecture in ["Hopper", "Blackwell"]',
    f'device.driver == "{DRIVER}" && has({A}.mig) && !{A}.mig && {A}.productName.startsWith("NVIDIA")',
    f'cel.bind(cc, {A}.cudaComputeCapability, cc.isGreaterThan(semver("8.0.0")) || cc.major() >= 10)'
    f" && {C}.multiprocessors.asInteger() > 50",
]


def fleet(count: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    devices = []
    for i in range(count):
        spec = MODELS[rng.randrange(len(MODELS))]
        devices.append(
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "model": {"string": spec["model"]},
                    "productName": {"string": f"NVIDIA {spec['model']} {spec['memory']}"},
                    "architecture": {"string": spec["arch"]},
                    "cudaComputeCapability": {"version": spec["cc"]},
                    "driverVersion": {"version": "550.54.15"},
                    "mig": {"bool": False},
                    "index": {"int": i % 8},
                    "uuid": {"string": f"GPU-{rng.getrandbits(64):016x}"},
                    "pciBusID": {"string": f"0000:{(i % 256):02x}:00.0"},
                },
                "capacity": {
                    "memory": {"value": spec["memory"]},
                    "multiprocessors": {"value": str(spec["sms"])},
                },
            }
        )
    return devices


def best_of(runs: int, measure: Callable[[], float]) -> float:
    """The best of a few runs: the least disturbed by other work on the machine."""
    return max(measure() for _ in range(runs))


def rate(
    evaluate: Callable[[Selector, str, dict[str, Any]], bool], selectors: list[Selector], devices: list[Any]
) -> float:
    start = time.perf_counter()
    for selector in selectors:
        for device in devices:
            evaluate(selector, DRIVER, device)
    return len(selectors) * len(devices) / (time.perf_counter() - start)


def effective_rate(
    engine: str, devices: list[Any], selectors: list[str] = SELECTORS
) -> tuple[float, list[int]]:
    """Compile from a cold cache, then memoized `matches` over the whole fleet."""
    clear_caches()
    start = time.perf_counter()
    counts = []
    for expression in selectors:
        selector = compile_selector(expression, engine=engine)
        counts.append(sum(selector.matches(DRIVER, device) for device in devices))
    return len(selectors) * len(devices) / (time.perf_counter() - start), counts


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cel", description=__doc__)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument(
        "--celpy-sample", type=int, default=400, help="devices per selector for raw cel-python"
    )
    args = parser.parse_args()
    devices = fleet(args.devices)

    cpp = [compile_selector(e, engine="cel-expr-python") for e in SELECTORS]
    # cel-python has no cel.bind, so it runs the first four selectors only.
    celpy_selectors = [compile_selector(e, engine="cel-python") for e in SELECTORS[:4]]
    raw_cpp = best_of(3, lambda: rate(Selector.matches_uncached, cpp, devices))
    raw_celpy = best_of(
        3, lambda: rate(Selector.matches_uncached, celpy_selectors, devices[: args.celpy_sample])
    )
    eff_cpp, counts_cpp = effective_rate("cel-expr-python", devices)
    eff_cpp = best_of(3, lambda: effective_rate("cel-expr-python", devices)[0])
    expected = [sum(s.matches_uncached(DRIVER, d) for d in devices) for s in cpp]
    assert counts_cpp == expected, (counts_cpp, expected)
    eff_celpy, celpy_counts = effective_rate("cel-python", devices, SELECTORS[:4])
    eff_celpy = best_of(3, lambda: effective_rate("cel-python", devices, SELECTORS[:4])[0])
    assert celpy_counts == expected[:4], (celpy_counts, expected[:4])

    print(f"devices={len(devices)} models={len(MODELS)} selectors={len(SELECTORS)} matches={counts_cpp}")
    print(f"{'measure':<56} {'evals/s':>12} {'vs raw cel-expr-python':>24}")
    rows = [
        ("raw cel-expr-python (baseline)", raw_cpp),
        (f"raw cel-python (first 4 selectors, {args.celpy_sample} devices)", raw_celpy),
        ("effective cel-expr-python (compile + memo)", eff_cpp),
        ("effective cel-python (compile + memo, 4 selectors)", eff_celpy),
    ]
    for label, value in rows:
        print(f"{label:<56} {value:>12,.0f} {value / raw_cpp:>23.2f}x")
    goal = eff_cpp / raw_cpp
    print(f"goal: effective >= 10x raw -> {goal:.1f}x {'met' if goal >= 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
