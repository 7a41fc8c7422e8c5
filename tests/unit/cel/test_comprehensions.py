"""Two-variable comprehensions, sortBy, includes, and the runtime iteration budget."""

from __future__ import annotations

import pytest

from controller.cel import ENGINES, CompileError, EvaluationError, compile_selector
from controller.cel.engine_cpp import ITERATION_LIMIT

DRIVER = "gpu.example.com"
DEVICE = {"name": "gpu-0", "attributes": {"model": {"string": "H100"}, "index": {"int": 2}}}


@pytest.mark.parametrize(
    "expression",
    [
        # Over a list the key is the index; over a map, the map's key.
        "[1, 2, 3].transformMap(i, v, v * 2) == {0: 2, 1: 4, 2: 6}",
        '{"a": 1, "b": 2}.transformMap(k, v, v > 1, v + 1) == {"b": 3}',
        'device.attributes["gpu.example.com"].transformMap(k, v, k == "model", v) == {"model": "H100"}',
        'device.attributes["other.example.com"].transformMap(k, v, v).size() == 0',
        # Each produced map is merged into the result.
        '["a", "b"].transformMapEntry(i, v, {v: i, v + "!": i * 10}) == {"a": 0, "a!": 0, "b": 1, "b!": 10}',
        '{"x": 1, "y": 2}.transformMapEntry(k, v, v == 2, {v: k})[2] == "y"',
        # Values keep their type through the map (a Quantity stays one), and the checker's
        # result type keeps upstream's O(1) Quantity `==` within the cost limit.
        '{"m": quantity("1Gi")}.transformMap(k, v, v)["m"] == quantity("1024Mi")',
        '{"m": quantity("1Gi")}.transformMap(k, v, v)["m"].isGreaterThan(quantity("1023Mi"))',
        "[true, false].transformMapEntry(i, v, {v: i}) == {true: 0, false: 1}",
    ],
)
def test_map_building_macros_evaluate_like_cel_go(expression: str) -> None:
    assert compile_selector(expression, engine="cel-expr-python").matches(DRIVER, DEVICE) is True


@pytest.mark.parametrize(
    ("expression", "key"),
    [
        ("[1, 1].transformMapEntry(i, v, {string(v): i}).size() == 1", "1"),
        ("[1, 2].transformMapEntry(i, v, {0: v}).size() == 1", "0"),
        ('{"a": true, "b": true}.transformMapEntry(k, v, {v: k}).size() == 1', "true"),
    ],
)
def test_transform_map_entry_duplicate_key_is_upstreams_runtime_error(expression: str, key: str) -> None:
    selector = compile_selector(expression, engine="cel-expr-python")
    with pytest.raises(EvaluationError) as failure:
        selector.matches(DRIVER, DEVICE)
    # cel-go common/types.InsertMapKeyValue's wording.
    assert failure.value.cause == f"insert failed: key {key} already exists"


def test_map_building_macros_stay_unavailable_in_cel_python() -> None:
    with pytest.raises(CompileError) as failure:
        compile_selector('{"a": 1}.transformMap(k, v, v + 1).size() == 1', engine="cel-python")
    assert "does not support two-variable comprehensions" in failure.value.message


@pytest.mark.parametrize("engine", ENGINES)
def test_includes_needs_a_release_whose_environment_has_lists_v1(engine: str) -> None:
    # Int elements: upstream's estimate has no size for the strings of a literal list, so
    # `["H100", "H200"].includes(...)` is over the cost limit (like indexOf).
    expression = '[0, 2].includes(device.attributes["gpu.example.com"].index)'
    with pytest.raises(CompileError, match="undeclared reference to 'includes'"):
        compile_selector(expression, engine=engine, kubernetes_version=(1, 37))
    selector = compile_selector(expression, engine=engine, kubernetes_version=(1, 38))
    assert selector.matches(DRIVER, DEVICE) is True
    scalar = compile_selector(
        'device.attributes["gpu.example.com"].model.includes("A100")',
        engine=engine,
        kubernetes_version=(1, 38),
    )
    assert scalar.matches(DRIVER, DEVICE) is False


def test_sort_by_is_gated_with_ext_lists() -> None:
    with pytest.raises(CompileError, match="undeclared reference to 'sortBy'"):
        compile_selector("[2, 1].sortBy(x, x) == [1, 2]", kubernetes_version=(1, 34))
    assert compile_selector("[2, 1].sortBy(x, x) == [1, 2]", kubernetes_version=(1, 35)).matches(
        DRIVER, DEVICE
    )


# 12,000 iterations in all: past cel-cpp's fixed budget, far below upstream's cost limit.
_TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
_OVER_ITERATION_LIMIT = (
    f"{_TEN}.map(a, {_TEN}.map(b, {_TEN}.map(c, {_TEN}.all(d, d > 0) && [1, 2].all(e, e > 0)))).size() == 10"
)


def test_past_cel_cpp_iteration_budget_is_evaluated_like_upstream() -> None:
    selector = compile_selector(_OVER_ITERATION_LIMIT, engine="cel-expr-python")
    assert selector.estimated_cost < 1_000_000
    assert selector.matches(DRIVER, DEVICE) is True
    assert selector.matches(DRIVER, DEVICE) == compile_selector(
        _OVER_ITERATION_LIMIT, engine="cel-python"
    ).matches(DRIVER, DEVICE)


def test_past_budget_without_a_fallback_says_why() -> None:
    # lists.range is a namespaced function cel-python lacks, so no engine here can finish it.
    selector = compile_selector(
        f"lists.range({ITERATION_LIMIT * 2}).all(x, x >= 0)", engine="cel-expr-python"
    )
    with pytest.raises(EvaluationError) as failure:
        selector.matches(DRIVER, DEVICE)
    assert f"stops after {ITERATION_LIMIT} comprehension iterations" in failure.value.cause
