"""The Kubernetes DRA CEL environment: compile device selectors and match devices.

    selector = compile_selector('device.attributes["gpu.example.com"].model == "H100"')
    selector.matches("gpu.example.com", device_json)   # bool, or EvaluationError

* The `device` variable is upstream's: driver, attributes[domain][id],
  capacity[domain][id] (Quantity), allowMultipleAllocations; unqualified names belong to
  the driver's domain; an unknown domain reads as an empty map, an unknown key is a
  runtime error (EvaluationError, never a silent false).
* Libraries (one Python implementation, shared by both engines): Kubernetes quantity,
  semver, lists, regex (find/findAll), IP/CIDR, URL, ext.Strings v2 (with format),
  ext.Lists and ext.Sets,
  optionals and cel.bind (cel-expr-python only).
* Releases: `compile_selector(expr, kubernetes_version=(1, 34))` (or $DRA_KUBERNETES_VERSION,
  or `--kubernetes-version` on the dra-controller commands) accepts only what that release's
  kube-apiserver accepts in a new selector; e.g. ext.Lists (sort, flatten, ...) is an
  "undeclared reference" before 1.35 (controller.cel.versions). Default: the newest release.
* Limits: expressions over 10 KiB are rejected; cost is a compile-time *estimate*
  (controller.cel.analysis) against upstream's 1,000,000 limit, rejected as "too complex,
  exceeds cost limit". At run time, size guards in every library function (strings/lists
  over 1,000,000 elements) bound the work, and regular expressions run on RE2 (linear
  time). Upstream stops one DeviceMatches at an *actual* cost of 1,000,000
  ("operation cancelled: actual cost limit exceeded"); cel-expr-python cannot count
  cost and stops after 10,000 comprehension iterations (fixed in its binding), far
  less than upstream allows (at least one cost unit per iteration). Past that, the
  evaluation is redone by cel-python when it can run the expression (correct, but
  slow: ~1-2 ms per iteration), and otherwise fails with a message saying so: a
  known difference (engine_cpp.CppProgram._over_budget).
* Two-variable comprehensions (all/exists/existsOne/transformList/transformMap/
  transformMapEntry, upstream's base environment since 1.32) and sortBy run on
  cel-expr-python only; a duplicate key in transformMapEntry fails as upstream's does.
* Engines: cel-expr-python (default) and cel-python (fallback; DRA_CEL_ENGINE=cel-python,
  or automatic when cel_expr_python cannot be imported).
* Speed: selectors within controller.cel.fastgen's coverage (attribute and capacity
  reads, comparisons, the libraries, cel.bind, most comprehensions; not uint, bytes,
  optionals, ext.Lists, sortBy, transformList/Map) are
  compiled once per driver into a Python function over the device JSON
  (controller.cel.fastpath), with cel-expr-python behind it for every device that function
  does not decide (a CEL runtime error, whose message is the engine's, or an unusual
  device); $DRA_CEL_FASTPATH=off turns it off. tests/unit/test_cel_fastpath_differential.py
  runs both on the evaluation corpus. Compiled selectors are cached (LRU). Where the
  engine runs, results are memoized per selector on exactly the device values the
  expression can read, so identical devices that differ only in name/UUID/index are
  evaluated once, and the `device` value handed to the engine holds only those values
  (controller.cel.device.ViewPlan).
"""

from controller.cel.errors import CompileError, EvaluationError
from controller.cel.selector import ENGINES, Selector, compile_selector

__all__ = ["ENGINES", "CompileError", "EvaluationError", "Selector", "compile_selector"]
