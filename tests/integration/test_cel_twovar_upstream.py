"""transformMap / transformMapEntry, and one past cel-cpp's iteration budget, decided as cel-go decides.

Every selector runs on every device both here (the default engine, cel-expr-python) and in
the celpeer harness (tests/cluster/peers: k8s.io/dynamic-resource-allocation/cel, i.e.
cel-go as kube-scheduler runs it); the outcome per device (match, no match, runtime
error) must be identical.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.peers import run_peer
from controller.cel import EvaluationError, compile_selector

pytestmark = pytest.mark.cluster

DRIVER = "gpu.example.com"
DEVICES: list[dict[str, Any]] = [
    {"name": "gpu-0", "attributes": {"model": {"string": "H100"}, "index": {"int": 2}}},
    {"name": "gpu-1", "attributes": {"model": {"string": "A100"}, "index": {"int": 0}}},
    {"name": "gpu-2", "attributes": {"model": {"string": "H100"}}},
    {"name": "gpu-3", "attributes": {"model": {"string": "B200"}, "index": {"int": 5}}},
]
_ATTRS = 'device.attributes["gpu.example.com"]'
TWO_VAR_SELECTORS = [
    # Over a map: key and value of each attribute, with a filter.
    f'{_ATTRS}.transformMap(k, v, k == "model", v) == {{"model": "H100"}}',
    f'{_ATTRS}.transformMap(k, v, k == "index", v).size() == 1',
    # Over a list: the key is the index; the transform reads the device (and fails without `index`).
    f'["a", "b"].transformMap(i, v, {_ATTRS}.index + i)[1] > 2',
    f"[1, 2, 3, 4].transformMap(i, v, v % 2 == 0, v * {_ATTRS}.index).exists(k, k == 3)",
    # transformMapEntry merges each produced map; a duplicate key is a runtime error
    # (here exactly on the H100 devices).
    f'["H100", "x"].transformMapEntry(i, v, {{v == "x" ? string({_ATTRS}.model) : v: i}}).size() == 2',
    f'{_ATTRS}.transformMapEntry(k, v, {{"one": k}}).size() == 1',
    f'{_ATTRS}.transformMapEntry(k, v, {{k + "-x": v}})["model-x"] == "A100"',
]
# 12,000 comprehension iterations: past cel-cpp's fixed budget of 10,000, far below
# upstream's cost limit of 1,000,000, so upstream evaluates it.
_TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
OVER_ITERATION_BUDGET = (
    f"{_TEN}.map(a, {_TEN}.map(b, {_TEN}.map(c, {_TEN}.all(d, d > 0) && [1, 2].all(e, e > 0))))"
    f".size() == 10 && {_ATTRS}.model == 'H100'"
)


def _ours(selector: str) -> list[str]:
    compiled = compile_selector(selector, engine="cel-expr-python")
    outcomes = []
    for device in DEVICES:
        try:
            outcomes.append("match" if compiled.matches(DRIVER, device) else "no match")
        except EvaluationError:
            outcomes.append("error")
    return outcomes


def _upstream(selectors: list[str]) -> list[list[str]]:
    result = run_peer("celpeer", {"driver": DRIVER, "selectors": selectors, "devices": DEVICES, "runs": 1})
    table = []
    for matches, errors in zip(result["matches"], result["errors"], strict=True):
        table.append(
            ["error" if i in errors else "match" if i in matches else "no match" for i in range(len(DEVICES))]
        )
    return table


def test_transform_map_selectors_decide_every_device_as_cel_go() -> None:
    upstream = _upstream(TWO_VAR_SELECTORS)
    for selector, theirs in zip(TWO_VAR_SELECTORS, upstream, strict=True):
        assert _ours(selector) == theirs, selector
    # The table exercises every outcome, the duplicate-key error included.
    assert {"match", "no match", "error"} <= {o for row in upstream for o in row}
    assert upstream[4] == ["error", "match", "error", "match"]


def test_past_cel_cpp_iteration_budget_decides_as_cel_go() -> None:
    (theirs,) = _upstream([OVER_ITERATION_BUDGET])
    assert theirs == ["match", "no match", "match", "no match"]
    assert _ours(OVER_ITERATION_BUDGET) == theirs
