"""`all`/`exists` that stop early no longer break a later comprehension or cel.bind (cel-cpp's
stale loop slots), and running every loop to the end keeps CEL's results, errors included."""

from __future__ import annotations

import pytest

from controller.cel import EvaluationError, compile_selector
from controller.cel.fullloops import run_loops_to_the_end

DRIVER = "gpu.example.com"
DEVICE = {"attributes": {"model": {"string": "h100"}, "index": {"int": 0}}}


@pytest.mark.parametrize(
    "expression",
    [
        # Each failed with "no such overload" before: the first loop stops after one element.
        "[1, 2].exists(k, true) && [3, 1].sortBy(x, -x).size() == 2",
        "![1, 2].all(k, false) && [3, 1].sortBy(x, -x)[0] == 3",
        '{"a": 1, "b": 2}.exists(k, true) && cel.bind(b, 1, b > 0)',
        '{"a": 1, "b": 2}.exists(k, v, true) && cel.bind(b, 1, b > 0)',
        f'device.attributes["{DRIVER}"].exists(k, true) && [3, 1].sortBy(x, -x)[0] == 3',
    ],
)
def test_an_early_exit_does_not_break_what_follows(expression: str) -> None:
    assert compile_selector(expression).matches(DRIVER, DEVICE) is True


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("[0, 1].exists(x, 1 / x > 0)", True),  # the error of x=0 is absorbed by the later true
        ("[1, 0].exists(x, 1 / x > 0)", True),
        ("[0, 1].all(x, 1 / x < 0)", False),  # absorbed by the false
        ("[1, 2].all(x, x > 0)", True),
        ("[1, 2].exists(x, x > 5)", False),
        ("[1, 2, 3].exists_one(x, x > 2)", True),
    ],
)
def test_running_to_the_end_keeps_the_result(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(DRIVER, DEVICE) is expected


def test_an_error_no_element_absorbs_stays_an_error() -> None:
    with pytest.raises(EvaluationError, match="divide by zero"):
        compile_selector("[1, 0].all(x, 1 / x > 0)").matches(DRIVER, DEVICE)


def test_malformed_programs_are_refused() -> None:
    with pytest.raises(ValueError, match="truncated"):
        run_loops_to_the_end(b"\x12\x05ab")
    assert run_loops_to_the_end(b"") == b""


def test_a_lone_loop_keeps_its_early_exit() -> None:
    # 20,000 elements run to the end would meet cel-cpp's 10,000-iteration cap (and cel-python
    # has no lists.range): with one loop nothing can read a stale slot, so it is left as it is.
    assert compile_selector("lists.range(20000).exists(x, x == 1)").matches(DRIVER, DEVICE) is True


def test_a_nested_loop_run_again_is_cured_too() -> None:
    assert compile_selector("[[1, 2], [3, 4]].map(l, l.exists(x, true)).all(b, b)").matches(DRIVER, DEVICE)
