"""Generated well-typed expressions in the engines' common subset: both engines must agree.

cel-python is an independent implementation of CEL (its own parser and interpreter), so
agreement on random programs checks our library wiring, device variable and error
mapping in the cel-expr-python engine, and vice versa.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cel import CompileError, EvaluationError, compile_selector

# cel-python raises the interpreter's recursion limit when it builds its parser; doing that
# at import keeps it from happening inside a Hypothesis run (which warns about it).
compile_selector("true", engine="cel-python")

DRIVER = "gpu.example.com"
A = 'device.attributes["gpu.example.com"]'
C = 'device.capacity["gpu.example.com"]'

DEVICES: list[dict[str, Any]] = [
    {
        "name": "gpu-0",
        "attributes": {
            "model": {"string": "H100"},
            "index": {"int": 3},
            "mig": {"bool": True},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    },
    {
        "name": "gpu-1",
        "attributes": {"model": {"string": "a100"}, "index": {"int": -2}, "mig": {"bool": False}},
        "capacity": {"memory": {"value": "40G"}},
    },
    {"name": "gpu-2"},
]

QUANTITIES = ["1", "80Gi", "40G", "500m", "1.5k", "2Mi", "bad", "1e3", "-3"]
VERSIONS = ["1.0.0", "550.54.15", "2.0.0-rc.1", "2.0.0", "v1", "0.9.12"]
WORDS = ["", "a", "H100", "a100", "gpu", "x y", "AbC"]


def _quote(text: str) -> str:
    return '"' + text + '"'


leaf_int = st.one_of(
    st.integers(min_value=-50, max_value=50).map(str),
    st.just(f"{A}.index"),
    st.sampled_from(VERSIONS).map(lambda v: f"semver({_quote(v)}, true).major()"),
)
leaf_str = st.one_of(st.sampled_from(WORDS).map(_quote), st.just(f"{A}.model"))
leaf_bool = st.one_of(st.sampled_from(["true", "false"]), st.just(f"{A}.mig"))


def _quantity() -> st.SearchStrategy[str]:
    literal = st.sampled_from(QUANTITIES).map(lambda q: f"quantity({_quote(q)})")
    return st.one_of(literal, st.just(f"{C}.memory"))


def _extend(children: st.SearchStrategy[tuple[str, str, str]]) -> st.SearchStrategy[tuple[str, str, str]]:
    ints = children.map(lambda c: c[0])
    strs = children.map(lambda c: c[1])
    bools = children.map(lambda c: c[2])
    int_ops = st.one_of(
        st.tuples(ints, st.sampled_from(["+", "-", "*", "/", "%"]), ints).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        strs.map(lambda s: f"size({s})"),
        st.tuples(bools, ints, ints).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
        st.tuples(_quantity(), _quantity()).map(lambda t: f"{t[0]}.compareTo({t[1]})"),
    )
    str_ops = st.one_of(
        st.tuples(strs, strs).map(lambda t: f"({t[0]} + {t[1]})"),
        strs.map(lambda s: f"{s}.lowerAscii()"),
        strs.map(lambda s: f"{s}.upperAscii()"),
        st.tuples(bools, strs, strs).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
    )
    bool_ops = st.one_of(
        st.tuples(ints, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), ints).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(strs, st.sampled_from(["==", "!=", "<", ">"]), strs).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(bools, st.sampled_from(["&&", "||"]), bools).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        bools.map(lambda b: f"!{b}"),
        st.tuples(strs, st.sampled_from(["contains", "startsWith", "endsWith"]), strs).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"
        ),
        st.tuples(ints, st.lists(st.integers(-5, 5), max_size=4)).map(lambda t: f"({t[0]} in {t[1]})"),
        st.tuples(_quantity(), st.sampled_from(["isGreaterThan", "isLessThan"]), _quantity()).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"
        ),
        st.tuples(st.sampled_from(VERSIONS), st.sampled_from(VERSIONS)).map(
            lambda t: f"semver({_quote(t[0])}, true).isLessThan(semver({_quote(t[1])}))"
        ),
        st.sampled_from(["model", "index", "mig", "nosuch"]).map(lambda k: f"has({A}.{k})"),
        st.sampled_from(WORDS).map(lambda w: f'("{w}" in device.attributes["other.dev"])'),
        strs.map(lambda s: f'{s}.matches("^[a-z]+$")'),
        # int(): upstream rejects a list literal mixing attribute values (`any`) and ints.
        st.lists(ints, min_size=1, max_size=3).map(
            lambda xs: f"[{', '.join(f'int({x})' for x in xs)}].exists(v, v > 0)"
        ),
    )
    return st.tuples(st.one_of(ints, int_ops), st.one_of(strs, str_ops), st.one_of(bools, bool_ops))


typed = st.recursive(st.tuples(leaf_int, leaf_str, leaf_bool), _extend, max_leaves=12)
expressions = typed.map(lambda t: t[2])


def outcome(expression: str, engine: str, device: dict[str, Any]) -> object:
    try:
        selector = compile_selector(expression, engine=engine)
    except CompileError:
        return "compile error"
    try:
        return selector.matches(DRIVER, device)
    except EvaluationError:
        return "runtime error"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression=expressions, device_index=st.integers(0, len(DEVICES) - 1))
def test_engines_agree(expression: str, device_index: int) -> None:
    device = DEVICES[device_index]
    fast = outcome(expression, "cel-expr-python", device)
    portable = outcome(expression, "cel-python", device)
    assert fast == portable, (
        f"{expression!r} on {device['name']}: cel-expr-python={fast} cel-python={portable}"
    )
    assert fast != "compile error", expression
