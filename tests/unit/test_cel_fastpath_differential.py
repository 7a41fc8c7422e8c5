"""The compiled fast path (controller.cel.fastpath) against the full engine (cel-expr-python).

Every expression, on every device: where the compiled function returns a bool it must be the
full engine's bool; where it reports a CEL error the full engine must fail too; and through
`Selector` (fast path on) every outcome, error messages included, must be the full engine's.

Expressions: the evaluation corpus (tests/celcorpus.py, the one compared with cel-go), the
corpus generator's comprehension-free expressions (what the fast path covers) for several
seeds, the benchmark's selectors, and hand-written edge cases (overflow, division, error
absorption, unqualified and doubled attribute names, malformed entries).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from bench.cel.__main__ import SELECTORS as BENCH_SELECTORS
from bench.cel.__main__ import fleet as bench_fleet
from controller.cel import CompileError, EvaluationError, compile_selector
from controller.cel.engine import EvalFailure, Program
from controller.cel.fastruntime import CelFailure, Unhandled
from controller.cel.selector import CPP_ENGINE, clear_caches
from tests.celcorpus import FLEET_DRIVER, Generator, _Scope, corpus, fleet

D = FLEET_DRIVER
A = f'device.attributes["{D}"]'

EDGE_EXPRESSIONS = [
    f"{A}.index + 9223372036854775807 > 0",
    f"{A}.index - 9223372036854775807 - 2 < 0",
    f"{A}.index * 4611686018427387904 >= 0",
    f"-(-9223372036854775807 - 1 + {A}.index) > 0",
    f"-{A}.index <= 0",
    f"{A}.index / 0 == 1 || true",
    f"{A}.index / 0 == 1 && false",
    f"{A}.index / 0 == 1 || false",
    f"-7 / ({A}.index + 2) == -3",
    f"-7 % ({A}.index + 2) == -1",
    f"7 % ({A}.index - 3) == 1",
    f"(-9223372036854775807 - 1) / ({A}.index - 1) < 0",
    f"{A}.index % ({A}.index - {A}.index) == 0",
    f"{A}.missing == 1 || {A}.index >= 0",
    f"{A}.index >= 0 || {A}.missing == 1",
    f"{A}.missing == 1 && {A}.index < 0",
    f"{A}.missing == 1 && {A}.index >= 0",
    f"!({A}.missing == 1) || !({A}.other == 2)",
    f'{A}.model == "H100" ? {A}.index > 2 : {A}.missing',
    f'{A}.productName.size() > 10 && {A}.productName.contains("H")',
    f'{A}.productName.endsWith("GB") || {A}.productName.startsWith("NVIDIA L")',
    f'{A}.productName + "!" == "NVIDIA L4!"',
    f'{A}.model < "B" || {A}.model >= "L"',
    f"{A}.model == 1",
    f"{A}.index == 1.0",
    f"{A}.index < 1.5",
    f'{A}.index in [1, 3, 5] || {A}.model in ["L4"]',
    f"{A}.index in [dyn({A}.index), dyn(99)]",
    f"{A}.index in [{A}.index]",
    f'{A}.model.matches("^[AH]")',
    f'matches({A}.model, "4$")',
    f'has({A}.productName) && !has({A}.nothing) && has(device.attributes["other.dev"].mig)',
    f'cel.bind(m, {A}.memory, m == "x") || device.capacity["{D}"].memory.isGreaterThan(quantity("30Gi"))',
    f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) == 0',
    f'device.capacity["{D}"].watts.asInteger() > 100',
    f'{A}.driverVersion.major() >= 550 && {A}.cudaComputeCapability.isLessThan(semver("9.0.0"))',
    f"{A}.mig == true || device.allowMultipleAllocations",
    f'device.driver == "{D}" && {A}.uuid.lowerAscii().startsWith("gpu")',
    f'{A}.productName.split(" ").size() == 3',
    f'ip("10.0.0.1").family() == 4 && {A}.model.indexOf("1") >= 0',
    f'{A}.uuid.substring(0, 100) == ""',
    f'quantity({A}.model) == quantity("1")',
    f"semver({A}.model).major() == 1",
    f'{A}.model != "a" && size([{A}.model]) == 1',
    f'({A}.index == 0 ? "a" : {A}.model) == "a"',
    f'({A}.index == 0 ? {A}.model : {A}.index) == "L4"',
    # Comprehensions and whole-domain reads.
    f'{A}.all(k, k != "model") || {A}.exists(k, {A}[k] == "L4")',
    "[1, 0, 2].all(x, 4 / x > 1)",
    "[1, 0, 2].exists(x, 4 / x > 3)",
    "[1, 0, 2].exists(x, 4 / x > 9)",
    "[0, 0].all(x, 4 / x > 1) || true",
    "[1, 2, 0].exists_one(x, 4 / x == 4)",
    "[1, 2, 3].exists_one(x, x > 2) && [1, 2].map(x, x * 2)[1] == 4",
    "[1, 2, 3].map(x, x > 1, x * 10).filter(y, y > 20).size() == 1",
    f'{A}.all(k, v, k.size() > 0 && v != "H100")',
    "[5, 6].exists(i, v, i == 1 && v == 6)",
    'device.attributes.exists(d, device.attributes[d].exists(k, k == "mig"))',
    f'device.capacity["{D}"].exists(k, device.capacity["{D}"][k].isGreaterThan(quantity("50Gi")))',
    f'"model" in {A} && !("nothing" in device.attributes["unknown.domain"])',
    'size(device.attributes["other.dev"]) > 1',
    "[1, 2][2] == 1 || [1, 2][1] == 2",
    f'{A}.productName.split(" ")[1] == "L4"',
    "[[1, 2], [3]].map(l, l.size())[0] == 2",
    # Past the fast path's iteration limit: the full engine takes the device.
    f"[{', '.join(['0'] * 95)}].all(x, [{', '.join(['0'] * 95)}].all(y, x == y))",
]


def _edge_devices() -> list[dict[str, Any]]:
    """Devices the corpus fleet lacks: unqualified names, both spellings, malformed entries."""
    base = fleet()
    unqualified = []
    for device in base[:8]:
        moved = copy.deepcopy(device)
        for table in ("attributes", "capacity"):
            entries = moved[table]
            assert isinstance(entries, dict)
            moved[table] = {name.removeprefix(f"{D}/"): value for name, value in entries.items()}
        unqualified.append(moved)
    both = copy.deepcopy(base[0])
    both["attributes"]["model"] = {"string": "L4"}  # type: ignore[index]
    odd_values: list[dict[str, Any]] = [
        {"name": "list-attr", "attributes": {f"{D}/model": {"strings": ["a"]}}, "capacity": {}},
        {"name": "two-fields", "attributes": {f"{D}/model": {"string": "a", "int": 1}}},
        {"name": "bad-version", "attributes": {f"{D}/driverVersion": {"version": "x.y"}}},
        {"name": "bool-int", "attributes": {f"{D}/index": {"int": True}}},
        {"name": "huge-int", "attributes": {f"{D}/index": {"int": 2**64}}},
        {"name": "none-entry", "attributes": {f"{D}/model": None}},
        {"name": "bad-capacity", "capacity": {f"{D}/memory": {"value": "lots"}}},
        {"name": "capacity-list", "capacity": []},
        {"name": "attributes-list", "attributes": []},
        {"name": "empty"},
        {"name": "int-index", "attributes": {f"{D}/index": {"int": -9223372036854775808}}},
        {"name": "amax", "attributes": {f"{D}/index": {"int": 3}}, "allowMultipleAllocations": 1},
    ]
    return [*unqualified, both, *odd_values]


def _full_outcome(program: Program, device: dict[str, Any]) -> bool | str:
    try:
        return program.evaluate(D, device)
    except EvalFailure as err:
        return f"error: {err}"


def _decide(function: Callable[[dict[str, Any]], bool], device: dict[str, Any]) -> object:
    """The compiled function's own verdict: its bool, or the signal class it raised."""
    try:
        return function(device)
    except CelFailure:
        return CelFailure
    except Unhandled:
        return Unhandled


def _selector_outcome(expression: str, device: dict[str, Any]) -> bool | str:
    try:
        return compile_selector(expression, engine=CPP_ENGINE).matches_uncached(D, device)
    except EvaluationError as err:
        return f"error: {err.cause}"


def differential(expressions: list[str], devices: list[dict[str, Any]]) -> Counter[str]:
    """Counts of what the compiled functions decided; asserts on every disagreement."""
    seen: Counter[str] = Counter()
    disagreements: list[str] = []
    for expression in expressions:
        try:
            selector = compile_selector(expression, engine=CPP_ENGINE)
        except CompileError:
            seen["compile error"] += 1
            continue
        if selector._fast is None:
            seen["full engine only"] += 1
            continue
        seen["compiled"] += 1
        # The pair under test: the compiled function and the engine's program behind it.
        function, full_program = selector._fast(D), selector._program
        for device in devices:
            full = _full_outcome(full_program, device)
            fast = _decide(function, device)
            if fast is Unhandled:
                seen["device left to the full engine"] += 1
            elif fast is CelFailure:
                seen["CEL error"] += 1
                if not isinstance(full, str):
                    disagreements.append(f"{expression!r} on {device.get('name')}: error, full engine {full}")
            else:
                seen["bool"] += 1
                if fast is not full:
                    disagreements.append(
                        f"{expression!r} on {device.get('name')}: {fast}, full engine {full}"
                    )
            if _selector_outcome(expression, device) != full:
                disagreements.append(f"{expression!r} on {device.get('name')}: Selector differs from {full}")
    assert not disagreements, "\n".join(disagreements[:20])
    return seen


def _generated(seed: int, count: int) -> list[str]:
    generator = Generator(seed)
    return list(dict.fromkeys(generator.nested(0, _Scope()) for _ in range(count)))


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    clear_caches()


def test_the_evaluation_corpus_agrees() -> None:
    seen = differential(corpus(600), fleet() + _edge_devices())
    assert seen["compiled"] and seen["bool"] and seen["CEL error"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_expressions_without_comprehensions_agree(seed: int) -> None:
    seen = differential(_generated(seed, 400), fleet() + _edge_devices())
    # Most of these are what the fast path is for: it must decide most of them itself.
    assert seen["compiled"] > seen["full engine only"]
    assert seen["bool"] > seen["device left to the full engine"]


def test_edge_cases_agree() -> None:
    seen = differential(EDGE_EXPRESSIONS, fleet() + _edge_devices())
    assert seen["compiled"] == len(EDGE_EXPRESSIONS)
    assert seen["CEL error"] and seen["device left to the full engine"]


def test_the_benchmark_selectors_agree() -> None:
    seen = differential(BENCH_SELECTORS, bench_fleet(400))
    assert seen["compiled"] == len(BENCH_SELECTORS)
    assert seen["device left to the full engine"] == 0
