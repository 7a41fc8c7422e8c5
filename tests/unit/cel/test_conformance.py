"""The conformance table, run on both engines."""

from __future__ import annotations

import pytest

from controller.cel import ENGINES, CompileError, EvaluationError, compile_selector
from tests.unit.cel.conformance import CASES, COMPILE, DEVICES, DRIVER, RUNTIME, UNSUPPORTED, Case


def _ids(case: Case) -> str:
    return f"{case.device}:{case.expression[:80]}"


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 150
    assert len({(c.expression, c.device) for c in CASES}) == len(CASES), "duplicate cases"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_case(case: Case, engine: str) -> None:
    expected = case.outcome(engine)
    device = DEVICES[case.device]
    if expected in (COMPILE, UNSUPPORTED):
        with pytest.raises(CompileError) as compile_failure:
            compile_selector(case.expression, engine=engine)
        if expected == UNSUPPORTED:
            assert "cel-python engine does not support" in compile_failure.value.message
        elif case.message and case.celpy is None:
            assert case.message in compile_failure.value.message
        assert compile_failure.value.line >= 1 and compile_failure.value.column >= 1
        return
    selector = compile_selector(case.expression, engine=engine)
    if expected == RUNTIME:
        with pytest.raises(EvaluationError) as runtime_failure:
            selector.matches(DRIVER, device)
        assert runtime_failure.value.device == device["name"]
        if case.message and case.celpy is None:
            assert case.message in runtime_failure.value.cause
        return
    assert selector.matches(DRIVER, device) is expected
