"""The compile-time cost estimate equals kube-apiserver's, rule by rule.

Each expected number is what upstream's estimator computes for the DRA environment
(dynamic-resource-allocation/cel CompileCELExpression's MaxCost, with the cel-go of
kube-apiserver 1.37.2, v0.29.2, and of 1.34.4, v0.26.0); the comment on each row names the
rule it pins down. tests/integration/test_cel_corpus_apiserver.py checks thousands of random
expressions against the real API server.
"""

from __future__ import annotations

import pytest

from controller.cel import CompileError, compile_selector, cost, syntax

A = 'device.attributes["gpu.example.com"]'
U64 = 2**64 - 1

# (expression, cost on 1.37, cost on 1.34 where it differs)
CASES: tuple[tuple[str, int, int | None], ...] = (
    # Kubernetes sets PresenceTestHasCost(false): has() adds nothing to its operand.
    (f"has({A}.uuid)", 3, None),
    # Two-variable comprehension over an indexed map: the key variable's path aliases the
    # value's ("@values"), so the key of a capacity map has the size of a quantity (0) ...
    ('device.capacity["other.dev"].exists(k, v, k == "abc")', 164, None),
    # ... and the key of an attribute map the size of an attribute value (64, not 32) ...
    ('device.attributes["other.dev"].exists(k, v, k.contains("abc"))', 388, None),
    # ... which the one-variable form does not do (the id size, 32) ...
    ('device.attributes["other.dev"].exists(k, k.contains("abc"))', 292, None),
    # ... nor a range path without spare capacity (the domain size, 63).
    ('device.capacity.exists(k, v, k == "abc")', 195, None),
    # Sorts estimate their result at n^2 elements; int elements are scalars (size 1).
    ("[1, 2, 3].sort().all(x, x > 0)", 85, None),
    ("[3, 1, 2].sortBy(x, -x).all(y, y > 0)", 150, None),
    # A dyn sort key matches every comparable overload, the string one (factor 2.1) dearest.
    (f"[{A}.index, {A}.model].sortBy(x, x).size() == 2", 89, None),
    # ext.Sets: |a| * |b| + 1.
    ("sets.contains([1, 2, 3], [2])", 24, None),
    ("sets.intersects([1, 2], [2, 5])", 25, None),
    # The global matches() is priced like the member form only from cel-go 0.27 (kube 1.37).
    ('matches(device.driver, "a")', 9, 3),
    ('device.driver.matches("a")', 9, None),
    # && and || cost their operands only.
    ("true && false", 0, None),
    # Equality scans the shorter side: the literal (15 characters), not the driver name (63).
    ('device.driver == "gpu.example.com"', 4, None),
    ('device.driver.replace("a", "bb") == "x"', 16, None),
    # Macro expansions: all (3 + body a step), exists_one (2 + body), map and filter (12 + ...).
    ("device.attributes.all(d, device.attributes[d].all(i, device.attributes[d][i] == 1))", 10499, None),
    (f'{A}.exists_one(i, i == "model")', 133, None),
    (f'{A}.map(i, i).filter(x, x.startsWith("m")).size() > 0', 923, None),
    (f'cel.bind(m, {A}, m.exists(k, v, k == "model"))', 207, None),
    # cel.bind's empty iteration range is a list creation (10).
    ("cel.bind(x, 1, x == 1)", 12, None),
    ("[1, 2].transformList(i, v, v * 2).exists(r, r > 2)", 62, None),
    # split() results have up to the string's length of elements, of unknown size.
    ('device.driver.split(",").exists(s, s == "a")', 394, None),
    # Quantity equality costs 1 (library.CostEstimator); != has no such rule and the
    # checker's size rule meets an unknown size.
    ('device.capacity["gpu.example.com"].memory == quantity("1Gi")', 6, None),
    ('device.capacity["gpu.example.com"].memory != quantity("1Gi")', 1844674407370955269, None),
    # Strings in a list literal have no declared size: a scan over them is unbounded.
    ('["a", "b"].isSorted()', 3689348814741910540, None),
    ("[1, 2].isSorted()", 12, None),
    # Nesting spans the limit: three levels over the attribute maps fit, four do not.
    ("device.attributes.all(a, device.attributes.all(b, device.attributes.all(c, a == b)))", 399555, None),
    (
        "device.attributes.all(a, device.attributes.all(b, device.attributes.all(c,"
        " device.attributes.all(d, a == b))))",
        12785859,
        None,
    ),
)


@pytest.mark.parametrize(("expression", "newest", "older"), CASES, ids=[c[0][:60] for c in CASES])
def test_estimate_equals_upstream(expression: str, newest: int, older: int | None) -> None:
    tree = syntax.parse(expression)
    assert cost.estimate(tree, (1, 37)) == newest
    assert cost.estimate(tree, (1, 34)) == (older if older is not None else newest)


def test_the_sort_of_unsized_strings_is_over_the_limit() -> None:
    expression = "[device.driver, device.driver, device.driver].sort().map(x, x < x).exists(r, r)"
    assert cost.estimate(syntax.parse(expression)) > 10**18
    with pytest.raises(CompileError, match="exceeds cost limit"):
        compile_selector(expression, kubernetes_version=(1, 37))


def test_compile_selector_prices_for_the_release() -> None:
    # 32^3 global matches() of a long regex: 170,179 before 1.37, 2,201,795 from 1.37 on.
    expression = (
        "device.attributes.all(a, device.attributes.all(b, device.attributes.all(c,"
        ' matches(c, "^(a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p)$"))))'
    )
    assert compile_selector(expression, kubernetes_version=(1, 34)).estimated_cost == 170179
    with pytest.raises(CompileError, match="estimated cost 2201795 > 1000000"):
        compile_selector(expression, kubernetes_version=(1, 37))
