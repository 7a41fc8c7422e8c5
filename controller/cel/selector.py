"""compile_selector / Selector: the public face of the DRA CEL environment."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Hashable, Mapping
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from controller.cel import analysis, literaltypes, syntax, versions
from controller.cel.device import device_name
from controller.cel.engine import Engine, EvalFailure, Program
from controller.cel.errors import CompileError, EngineUnavailable, EvaluationError
from controller.cel.fastruntime import SIGNALS as FAST_PATH_SIGNALS
from controller.cel.memo import KeyPlan
from controller.cel.syntax import ParseFailure
from dracommon.kubeversion import NEWEST_KNOWN, KubernetesVersion

if TYPE_CHECKING:
    from logging import Logger


def _log() -> Logger:
    """This module's logger. `logging` is imported where something is logged: its import (~3 ms)
    was a tenth of explain's start-up beyond the interpreter, which logs nothing here."""
    import logging

    return logging.getLogger(__name__)


# Upstream limits for a CEL device selector (resource.k8s.io/v1 validation).
MAX_EXPRESSION_LENGTH = 10 * 1024
MAX_COST = 1_000_000

ENGINE_ENV = "DRA_CEL_ENGINE"
CPP_ENGINE = "cel-expr-python"
CELPY_ENGINE = "cel-python"
ENGINES = (CPP_ENGINE, CELPY_ENGINE)
# cel-python is an optional extra (pyproject.toml): say how to get it when it is chosen but absent.
_INSTALL_HINTS = {
    CELPY_ENGINE: (
        f" (the portable fallback, chosen by {ENGINE_ENV}={CELPY_ENGINE} or when {CPP_ENGINE} cannot"
        " be loaded, is the optional extra: pip install 'draplugin[fallback]')"
    )
}

# A driver name -> the compiled selector for that driver (controller.cel.fastpath).
FastPath = Callable[[str], Callable[[Mapping[str, Any]], bool]]

_COMPILE_CACHE_SIZE = 256
_MEMO_SIZE = 4096
_MAX_PLANS = 64


def default_engine() -> str:
    chosen = os.environ.get(ENGINE_ENV, "").strip()
    if chosen:
        return chosen
    try:
        _load_engine(CPP_ENGINE)
    except EngineUnavailable:
        return CELPY_ENGINE
    return CPP_ENGINE


@cache
def _load_engine(name: str) -> Engine:
    try:
        if name == CPP_ENGINE:
            from controller.cel.engine_cpp import CppEngine

            return CppEngine()
        if name == CELPY_ENGINE:
            from controller.cel.engine_celpy import CelpyEngine

            return CelpyEngine()
    except ImportError as err:
        raise EngineUnavailable(
            f"CEL engine {name} cannot be loaded: {err}{_INSTALL_HINTS.get(name, '')}"
        ) from err
    raise EngineUnavailable(f"unknown CEL engine {name!r}; choose one of {', '.join(ENGINES)}")


class Selector:
    """A compiled device selector. Thread-safe; results are memoized per device content."""

    def __init__(
        self,
        expression: str,
        engine: str,
        program: Program,
        info: analysis.Analysis,
        *,
        fast: FastPath | None = None,
    ) -> None:
        self.expression = expression
        self.engine = engine
        self._program = program
        # The compiled-Python form (controller.cel.fastpath), per driver: it decides a device
        # faster than a memo lookup, so the memo and `_program` serve only what it leaves.
        self._fast = fast
        self._fast_functions: dict[str, Callable[[Mapping[str, Any]], bool]] = {}
        self._info = info
        self._memo: dict[Hashable, bool | str] = {}
        self._plans: dict[str, KeyPlan] = {}
        self._lock = threading.Lock()

    @property
    def estimated_cost(self) -> int:
        return self._info.cost

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        """True if the device is selected; EvaluationError on any runtime error or non-bool result."""
        if self._fast is not None:
            try:
                return (self._fast_functions.get(driver) or self._fast_function(driver))(device)
            except FAST_PATH_SIGNALS:
                pass  # a CEL error or an unusual device: the engine's program says what it is
        key = self._key(driver, device)
        if key is not None:
            # Reads need no lock: dict lookups are atomic, and a racing miss only evaluates twice.
            cached = self._memo.get(key)
            if cached is not None:
                if cached.__class__ is str:
                    raise EvaluationError(device_name(device), cached)
                return cached  # type: ignore[return-value]
        outcome: bool | str
        try:
            outcome = self._program.evaluate(driver, device)
        except EvalFailure as err:
            outcome = str(err)
        if key is not None:
            with self._lock:
                if len(self._memo) >= _MEMO_SIZE:
                    # Oldest first (insertion order): cheaper than LRU bookkeeping on every hit.
                    del self._memo[next(iter(self._memo))]
                self._memo[key] = outcome
        if isinstance(outcome, str):
            raise EvaluationError(device_name(device), outcome)
        return outcome

    def _key(self, driver: str, device: Mapping[str, Any]) -> Hashable | None:
        if self._info.reads is None or not (type(device) is dict or isinstance(device, Mapping)):
            return None
        plan = self._plans.get(driver)
        if plan is None:
            plan = KeyPlan(self._info.reads, driver)
            with self._lock:
                if len(self._plans) < _MAX_PLANS:
                    self._plans[driver] = plan
        return plan.key(device)

    def matches_uncached(self, driver: str, device: Mapping[str, Any]) -> bool:
        """`matches` without memoization (benchmarks, and checking the memo itself)."""
        if self._fast is not None:
            try:
                return (self._fast_functions.get(driver) or self._fast_function(driver))(device)
            except FAST_PATH_SIGNALS:
                pass
        try:
            return self._program.evaluate(driver, device)
        except EvalFailure as err:
            raise EvaluationError(device_name(device), str(err)) from None

    def fast_function(self, driver: str) -> Callable[[Mapping[str, Any]], bool] | None:
        """The compiled-Python form for `driver`'s devices, or None where there is none. It
        decides most devices as `matches` does and raises for the rest (a CEL error, an unusual
        device), which `matches` then answers: a caller that runs it over many devices itself
        saves `matches`'s dispatch on each."""
        if self._fast is None:
            return None
        return self._fast_functions.get(driver) or self._fast_function(driver)

    def _fast_function(self, driver: str) -> Callable[[Mapping[str, Any]], bool]:
        assert self._fast is not None
        function = self._fast(driver)
        with self._lock:
            if len(self._fast_functions) < _MAX_PLANS:
                self._fast_functions[driver] = function
        return function

    @property
    def compiled_to_python(self) -> bool:
        """Whether the fast path (controller.cel.fastpath) runs this selector."""
        return self._fast is not None

    def __repr__(self) -> str:
        return f"Selector({self.expression!r}, engine={self.engine!r})"


def compile_selector(
    expression: str, *, engine: str | None = None, kubernetes_version: KubernetesVersion | None = None
) -> Selector:
    """Compile a DRA device selector (a CEL expression over `device`). Raises CompileError.

    `kubernetes_version` (major, minor) is the release of the API server the selector is
    written for: libraries that release does not accept in a new selector are undeclared
    there (`controller.cel.versions`). Default: $DRA_KUBERNETES_VERSION, else the newest.
    """
    if not isinstance(expression, str):
        raise CompileError("expression must be a string")
    chosen = engine or default_engine()
    version = kubernetes_version if kubernetes_version is not None else versions.default_version()
    return _compile_cached(expression, chosen, version)


@lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_cached(expression: str, engine_name: str, version: KubernetesVersion = NEWEST_KNOWN) -> Selector:
    if len(expression.encode()) > MAX_EXPRESSION_LENGTH:
        raise CompileError(f"expression too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes")
    try:
        engine = _load_engine(engine_name)
    except EngineUnavailable as err:
        raise CompileError(str(err)) from None
    info = analysis.for_release(_analyze(expression, engine), expression, version)
    versions.check_available(expression, info.calls, version)
    program = engine.compile(expression, info)
    # A validator upstream runs after type checking: its errors come after the engine's.
    literaltypes.check_homogeneous_literals(expression)
    if info.cost > MAX_COST:
        raise CompileError(f"too complex, exceeds cost limit (estimated cost {info.cost} > {MAX_COST})")
    if "logging" in sys.modules:  # never imported: nothing is configured to take a debug record
        _log().debug(
            "compiled CEL selector",
            extra={"engine": engine_name, "cost": info.cost, "memoized": info.reads is not None},
        )
    return Selector(
        expression, engine_name, program, info, fast=_fast_path(expression, engine_name, info, program)
    )


def _fast_path(
    expression: str, engine_name: str, info: analysis.Analysis, program: Program
) -> FastPath | None:
    """The compiled-Python form in front of cel-expr-python, where it covers the expression.

    Only there: it answers exactly as that engine does (and hands it what it cannot decide).
    Imported here: it builds on that engine's module, which cel-python-only hosts lack.
    """
    if engine_name != CPP_ENGINE:
        return None
    from controller.cel import fastpath

    if not fastpath.enabled():
        return None
    accelerated = fastpath.accelerate(expression, info, program)
    return accelerated.function if isinstance(accelerated, fastpath.FastProgram) else None


def _analyze(expression: str, engine: Engine) -> analysis.Analysis:
    try:
        return analysis.analyze(expression)
    except CompileError as err:
        # The engine's own diagnosis (position and wording) wins when it has one.
        engine.compile(expression, analysis.Analysis(frozenset(), None, 0))
        if not isinstance(err, ParseFailure) or engine.name != CPP_ENGINE:
            raise
        # Our parser missed syntax the engine accepts: run without memoization or cost estimate.
        _log().warning(
            "CEL selector not analyzable; no memoization or cost estimate", extra={"reason": str(err)}
        )
        return analysis.Analysis(analysis.literal_strings(expression), None, 0)


def clear_caches() -> None:
    """Forget compiled selectors (for tests and long-running processes that reload config)."""
    _compile_cached.cache_clear()
    syntax.parse.cache_clear()
