"""Selector behaviour beyond single expressions: caching, memoization, limits, engines."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from controller.cel import ENGINES, CompileError, EvaluationError, compile_selector, selector
from controller.cel.analysis import analyze
from controller.cel.errors import LibraryError
from controller.cel.stringlib import replace

DRIVER = "gpu.example.com"
MODEL = 'device.attributes["gpu.example.com"].model == "H100"'


def gpu(name: str, model: str = "H100", **extra: Any) -> dict[str, Any]:
    attributes = {"model": {"string": model}, "uuid": {"string": f"GPU-{name}"}, "index": {"int": len(name)}}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}, **extra}


class CountingProgram:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def evaluate(self, driver: str, device: Any) -> bool:
        self.calls += 1
        result: bool = self.inner.evaluate(driver, device)
        return result


def counting(expression: str, engine: str) -> tuple[selector.Selector, CountingProgram]:
    compiled = selector._compile_cached.__wrapped__(expression, engine)
    spy = CountingProgram(compiled._program)
    compiled._program = spy
    # The memo serves what the compiled fast path leaves; here every device goes to it
    # (tests/unit/test_cel_fastpath_differential.py covers the fast path).
    compiled._fast = None
    return compiled, spy


@pytest.mark.parametrize("engine", ENGINES)
def test_identical_devices_are_evaluated_once(engine: str) -> None:
    compiled, spy = counting(MODEL, engine)
    results = [compiled.matches(DRIVER, gpu(f"gpu-{i}")) for i in range(50)]
    assert results == [True] * 50
    assert spy.calls == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_memo_key_covers_every_value_the_expression_reads(engine: str) -> None:
    compiled, spy = counting(MODEL, engine)
    assert compiled.matches(DRIVER, gpu("a", "H100"))
    assert not compiled.matches(DRIVER, gpu("b", "A100"))
    assert compiled.matches(DRIVER, gpu("c", "H100"))
    assert not compiled.matches(
        "other.example.com", {"name": "d", "attributes": {"gpu.example.com/model": {"string": "A100"}}}
    )
    assert spy.calls == 3


def test_qualified_and_unqualified_names_are_the_same_attribute() -> None:
    compiled = compile_selector(MODEL)
    assert compiled.matches(
        DRIVER, {"name": "q", "attributes": {"gpu.example.com/model": {"string": "H100"}}}
    )
    assert compiled.matches(DRIVER, {"name": "u", "attributes": {"model": {"string": "H100"}}})
    # For another driver, an unqualified name belongs to that driver's domain.
    with pytest.raises(EvaluationError, match="no such key: model"):
        compiled.matches("other.example.com", {"name": "o", "attributes": {"model": {"string": "H100"}}})


def test_memoized_errors_still_name_each_device() -> None:
    compiled = compile_selector('device.attributes["gpu.example.com"].nosuch == 1')
    for name in ("gpu-a", "gpu-b"):
        with pytest.raises(EvaluationError) as failure:
            compiled.matches(DRIVER, gpu(name))
        assert failure.value.device == name
        assert str(failure.value) == f"device {name}: no such key: nosuch"


def test_reads_are_collected_statically() -> None:
    info = analyze(
        'device.attributes["a.dev"].x == 1 && device.capacity["b.dev"]["y"].isInteger()'
        ' && device.driver == "d"'
    )
    assert info.reads == (("attributes", "a.dev", "x"), ("capacity", "b.dev", "y"), ("driver", "", ""))
    assert analyze('"k" in device.attributes["a.dev"]').reads == (("attributes", "a.dev", "*"),)
    assert analyze("device.attributes[device.driver].x == 1").reads == (
        ("attributes", "*", "*"),
        ("driver", "", ""),
    )
    # `device` escaping into a binding: we cannot tell what is read, so nothing is memoized.
    assert analyze("cel.bind(d, device, d.driver == 'x')").reads is None
    # A shadowing comprehension variable is not the device.
    assert analyze("[1].all(device, device > 0)").reads == ()


def test_unknown_domain_rewrite_compiles_for_every_table_expression() -> None:
    from controller.cel.engine_cpp import _environment, tolerant_lookups
    from tests.unit.cel.conformance import CASES

    rewritten = 0
    for case in CASES:
        try:
            compile_selector(case.expression, engine="cel-expr-python")
        except CompileError:
            continue
        info = analyze(case.expression)
        if info.domain_lookups:
            _environment().compile(tolerant_lookups(case.expression, info.domain_lookups))
            rewritten += 1
    assert rewritten > 100


def test_compile_cache_returns_the_same_selector() -> None:
    assert compile_selector(MODEL) is compile_selector(MODEL)
    assert compile_selector(MODEL, engine="cel-python") is not compile_selector(
        MODEL, engine="cel-expr-python"
    )


def test_compile_error_carries_position() -> None:
    with pytest.raises(CompileError) as failure:
        compile_selector("device.driver ==\n  && true")
    assert (failure.value.line, failure.value.column) == (2, 3)
    assert str(failure.value).startswith("line 2, column 3: ")


def test_expression_length_limit() -> None:
    long_expression = "true" + " && true" * 1400
    assert len(long_expression) > 10240
    with pytest.raises(CompileError, match="may not be more than 10240 bytes"):
        compile_selector(long_expression)


@pytest.mark.parametrize("engine", ["cel-expr-python"])
def test_exponential_string_growth_exceeds_cost_limit(engine: str) -> None:
    expression = '"xxxxxxxxxx"'
    for _ in range(24):
        expression = f"cel.bind(s, {expression}, s + s)"
    with pytest.raises(CompileError, match="too complex, exceeds cost limit"):
        compile_selector(f"size({expression}) > 0", engine=engine)


def test_nested_comprehensions_exceed_cost_limit() -> None:
    expression = "lists.range(200).all(x, lists.range(200).all(y, lists.range(200).all(z, x + y + z >= 0)))"
    with pytest.raises(CompileError, match="exceeds cost limit"):
        compile_selector(expression)


def test_deeply_nested_expression_is_a_compile_error_not_a_crash() -> None:
    with pytest.raises(CompileError):
        compile_selector("(" * 3000 + "true" + ")" * 3000)
    with pytest.raises(CompileError):
        compile_selector("!" * 5000 + "true")


def test_library_results_are_size_guarded() -> None:
    with pytest.raises(LibraryError, match="cost limit"):
        replace("a" * 2000, "a", "b" * 1000)


def test_unknown_engine_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="unknown CEL engine 'nope'"):
        compile_selector(MODEL, engine="nope")


def test_engine_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(selector.ENGINE_ENV, "cel-python")
    assert compile_selector(MODEL).engine == "cel-python"
    monkeypatch.delenv(selector.ENGINE_ENV)
    assert compile_selector(MODEL).engine == "cel-expr-python"


def test_falls_back_to_cel_python_without_cel_expr_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(selector.ENGINE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "cel_expr_python", None)
    monkeypatch.delitem(sys.modules, "controller.cel.engine_cpp", raising=False)
    selector._load_engine.cache_clear()
    try:
        assert selector.default_engine() == "cel-python"
        assert compile_selector(MODEL).matches(DRIVER, gpu("x"))
    finally:
        selector._load_engine.cache_clear()


def test_the_fallback_engine_missing_says_which_extra_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # cel-python is the optional extra `fallback`: choosing it without it installed is a clear error.
    monkeypatch.setitem(sys.modules, "celpy", None)
    monkeypatch.delitem(sys.modules, "controller.cel.engine_celpy", raising=False)
    selector._load_engine.cache_clear()
    selector._compile_cached.cache_clear()
    hint = r"cel-python cannot be loaded: .*pip install 'draplugin\[fallback\]'"
    try:
        with pytest.raises(CompileError, match=hint):
            compile_selector(MODEL, engine="cel-python")
    finally:
        selector._load_engine.cache_clear()
        selector._compile_cached.cache_clear()


def test_invalid_device_shape_is_an_evaluation_error() -> None:
    compiled = compile_selector(MODEL)
    with pytest.raises(EvaluationError, match="invalid device"):
        compiled.matches(DRIVER, {"name": "bad", "attributes": {"model": {"string": "H100", "int": 1}}})


def test_memo_never_hides_an_invalid_value_type() -> None:
    compiled = compile_selector('device.attributes["gpu.example.com"].index == 1')
    assert compiled.matches(DRIVER, {"name": "ok", "attributes": {"index": {"int": 1}}})
    with pytest.raises(EvaluationError, match="invalid device"):
        compiled.matches(DRIVER, {"name": "bad", "attributes": {"index": {"int": True}}})


def test_matches_uncached_agrees_with_matches() -> None:
    compiled = compile_selector(MODEL)
    for device in (gpu("a"), gpu("b", "A100")):
        assert compiled.matches_uncached(DRIVER, device) == compiled.matches(DRIVER, device)
