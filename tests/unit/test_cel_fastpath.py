"""Where the compiled fast path (controller.cel.fastpath) runs, and where it does not."""

from __future__ import annotations

import pytest

from controller.cel import compile_selector, fastgen
from controller.cel.fastpath import FASTPATH_ENV
from controller.cel.selector import CELPY_ENGINE, CPP_ENGINE, clear_caches

A = 'device.attributes["gpu.example.com"]'
COVERED = f'{A}.model == "H100" && device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("1Gi"))'


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    clear_caches()


@pytest.mark.parametrize(
    "expression",
    [
        COVERED,
        'device.attributes["gpu.example.com"].all(k, k != "x")',  # a comprehension
        '"x" in device.attributes["gpu.example.com"]',  # a whole-domain read
    ],
)
def test_a_covered_selector_runs_compiled(expression: str) -> None:
    assert compile_selector(expression, engine=CPP_ENGINE).compiled_to_python


@pytest.mark.parametrize(
    "expression",
    [
        "[3, 1].sort()[0] == 1",  # ext.Lists, native in cel-expr-python
        "[1, 2].transformList(i, v, v * 2)[0] == 2",  # transformList
        f"{A}.index == 1u",  # uint
        f'{A}.?model.orValue("") == "H100"',  # optionals
        f'{A}.model == b"x"',  # bytes
    ],
)
def test_what_it_does_not_cover_stays_on_the_engine(expression: str) -> None:
    assert not compile_selector(expression, engine=CPP_ENGINE).compiled_to_python


def test_it_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FASTPATH_ENV, "off")
    assert not compile_selector(COVERED, engine=CPP_ENGINE).compiled_to_python


def test_it_stands_only_in_front_of_cel_expr_python() -> None:
    pytest.importorskip("celpy")
    assert not compile_selector(COVERED, engine=CELPY_ENGINE).compiled_to_python


def test_a_fault_in_the_fast_path_leaves_the_selector_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise KeyError("a generator fault")

    monkeypatch.setattr(fastgen, "generate", broken)
    selector = compile_selector(COVERED, engine=CPP_ENGINE)
    assert not selector.compiled_to_python
    assert (
        selector.matches("gpu.example.com", {"name": "d", "attributes": {"model": {"string": "L4"}}}) is False
    )
