"""The Kubernetes DRA CEL environment: compile device selectors and match devices.

    selector = compile_selector('device.attributes["gpu.example.com"].model == "H100"')
    selector.matches("gpu.example.com", device_json)   # bool, or EvaluationError

Engines: cel-expr-python (default) and cel-python (fallback; DRA_CEL_ENGINE=cel-python).
"""

from controller.cel.errors import CompileError, EvaluationError
from controller.cel.selector import ENGINES, Selector, compile_selector

__all__ = ["ENGINES", "CompileError", "EvaluationError", "Selector", "compile_selector"]
