"""A disagreement reduced to a minimal scenario, printed as a ready-to-commit pytest case.

Greedy delta debugging: every one-step reduction of the current scenario (drop a node, a
slice, a device, an earlier claim, a claim, a request, a subrequest, a constraint, a selector,
a taint, a toleration, a capacity, counters; complete an incomplete pool) is played at once,
each under a tag of its own, and the first that still shows a disagreement of the same kind
(the first word of the problem) becomes the current one, until none does.
"""

from __future__ import annotations

import copy
import itertools
import json
import pprint
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from tests.differential.play import Player, Verdict
from tests.differential.scenario import JSON, Scenario

MAX_ROUNDS = 40


def kind_of(problem: str | None) -> str:
    return (problem or "").split(":", 1)[0]


def shrink(player: Player, verdict: Verdict, retag: Callable[[], str]) -> Verdict:
    """The smallest variant found that still disagrees in the way `verdict` does."""
    current = verdict
    wanted = kind_of(verdict.problem)
    for _ in range(MAX_ROUNDS):
        candidates = [c.retagged(retag()) for c in reductions(current.scenario)]
        if not candidates:
            break
        found = next(
            (v for v in player.play(candidates) if v.problem is not None and kind_of(v.problem) == wanted),
            None,
        )
        if found is None:
            break
        current = found
    return current


def reductions(s: Scenario) -> Iterator[Scenario]:
    """Each scenario one step smaller than `s` (some may be invalid: the API server refuses them)."""
    yield from _drop_nodes(s)
    yield from _drop_list_items(s, "blockers")
    yield from _drop_list_items(s, "claims", keep=1)
    yield from _drop_list_items(s, "slices")
    for si, slice_obj in enumerate(s.slices):
        pool = slice_obj["spec"]["pool"]
        present = sum(1 for o in s.slices if o["spec"]["pool"]["name"] == pool["name"])
        if pool["resourceSliceCount"] != present:
            yield _edit(s, _set_pool_count, si, present)
        for di, dev in enumerate(slice_obj["spec"].get("devices") or []):
            yield _edit(s, _drop_device, si, di)
            for key in ("taints", "capacity", "consumesCounters", "allowMultipleAllocations"):
                if key in dev:
                    yield _edit(s, _drop_device_field, si, di, key)
            if "memory" in (dev.get("attributes") or {}):
                yield _edit(s, _drop_memory_attribute, si, di)
    for ci, c in enumerate(s.claims):
        devices = c["spec"]["devices"]
        if len(devices["requests"]) > 1:
            for ri in range(len(devices["requests"])):
                yield _edit(s, _drop_request, ci, ri)
        for k in range(len(devices.get("constraints") or [])):
            yield _edit(s, _drop_constraint, ci, k)
        for ri, request in enumerate(devices["requests"]):
            subs = request.get("firstAvailable")
            if subs and len(subs) > 1:
                for k in range(len(subs)):
                    yield _edit(s, _drop_subrequest, ci, ri, k)
            for path, spec in _specs(request):
                for key in ("selectors", "tolerations", "capacity", "adminAccess", "count"):
                    for variant in _smaller(spec, key):
                        yield _edit(s, _set_spec_field, ci, ri, path, key, variant)
    if len(s.classes) > 1:
        used = json.dumps(s.claims) + json.dumps(s.blockers)
        for k, cls in enumerate(s.classes):
            if f'"{cls["metadata"]["name"]}"' not in used:
                yield _edit(s, _drop_class, k)


def _edit(s: Scenario, change: Callable[..., Any], *args: Any) -> Scenario:
    t = copy.deepcopy(s)
    change(t, *args)
    return t


def _drop_device_field(t: Scenario, si: int, di: int, key: str) -> None:
    t.slices[si]["spec"]["devices"][di].pop(key)


def _drop_memory_attribute(t: Scenario, si: int, di: int) -> None:
    t.slices[si]["spec"]["devices"][di]["attributes"].pop("memory")


def _drop_request(t: Scenario, ci: int, ri: int) -> None:
    t.claims[ci]["spec"]["devices"]["requests"].pop(ri)


def _drop_constraint(t: Scenario, ci: int, k: int) -> None:
    constraints = t.claims[ci]["spec"]["devices"]["constraints"]
    constraints.pop(k)
    if not constraints:
        del t.claims[ci]["spec"]["devices"]["constraints"]


def _drop_subrequest(t: Scenario, ci: int, ri: int, k: int) -> None:
    _request(t, ci, ri)["firstAvailable"].pop(k)


def _set_spec_field(t: Scenario, ci: int, ri: int, path: int | None, key: str, value: Any) -> None:
    _set(_spec_at(_request(t, ci, ri), path), key, value)


def _drop_class(t: Scenario, k: int) -> None:
    t.classes.pop(k)


def _drop_nodes(s: Scenario) -> Iterator[Scenario]:
    if len(s.nodes) < 2:
        return
    for node in s.nodes:
        t = copy.deepcopy(s)
        t.nodes.remove(node)
        t.slices = [o for o in t.slices if o["spec"].get("nodeName") != node]
        t.blockers = [b for b in t.blockers if node not in json.dumps(b["status"])]
        yield t


def _drop_list_items(s: Scenario, field: str, keep: int = 0) -> Iterator[Scenario]:
    items = getattr(s, field)
    if len(items) <= keep:
        return
    for k in range(len(items)):
        t = copy.deepcopy(s)
        getattr(t, field).pop(k)
        yield t


def _set_pool_count(t: Scenario, si: int, count: int) -> None:
    name = t.slices[si]["spec"]["pool"]["name"]
    for o in t.slices:
        if o["spec"]["pool"]["name"] == name:
            o["spec"]["pool"]["resourceSliceCount"] = count


def _drop_device(t: Scenario, si: int, di: int) -> None:
    spec = t.slices[si]["spec"]
    dev = spec["devices"].pop(di)
    held = (spec["pool"]["name"], dev["name"])
    t.blockers = [
        b for b in t.blockers
        if all((r["pool"], r["device"]) != held for r in b["status"]["allocation"]["devices"]["results"])
    ]  # fmt: skip


def _request(t: Scenario, ci: int, ri: int) -> JSON:
    request: JSON = t.claims[ci]["spec"]["devices"]["requests"][ri]
    return request


def _specs(request: JSON) -> Iterator[tuple[int | None, JSON]]:
    if "exactly" in request:
        yield None, request["exactly"]
    yield from enumerate(request.get("firstAvailable") or [])


def _spec_at(request: JSON, path: int | None) -> JSON:
    spec: JSON = request["exactly"] if path is None else request["firstAvailable"][path]
    return spec


def _smaller(spec: JSON, key: str) -> Iterator[Any]:
    """Smaller values for `spec[key]` (None: drop the key)."""
    value = spec.get(key)
    if value is None:
        return
    if key == "selectors" and len(value) > 1:
        for k in range(len(value)):
            yield value[:k] + value[k + 1 :]
    if key == "count":
        if value > 1:
            yield 1
        return
    yield None


def _set(spec: JSON, key: str, value: Any) -> None:
    if value is None:
        spec.pop(key, None)
    else:
        spec[key] = value


# ----- the printed case


def pytest_case(verdict: Verdict, release: str) -> str:
    """A test function for tests/integration/test_differential_cases.py."""
    s = verdict.scenario
    name = f"test_differential_{s.tag.replace('-', '_')}"
    # A Python literal (True, not JSON's true); `ruff format` tidies it when committed.
    body = textwrap.indent(pprint.pformat(s.to_json(), width=100, sort_dicts=False), "        ")
    problem = (verdict.problem or "").replace('"""', "'''")
    return (
        f"# Found on {release}; runs on 1.{s.minor} only. Mark it xfail(strict=True, reason=...) while\n"
        f"# the disagreement stands.\n"
        f"def {name}(kube_cluster: ControlPlane) -> None:\n"
        f'    """{textwrap.shorten(problem, 400)}"""\n'
        f"    scenario = Scenario.from_json(\n{body}\n    )\n"
        f"    assert_agrees(kube_cluster, scenario)\n"
    )


def tags(prefix: str) -> Callable[[], str]:
    """Fresh fixed-width tags (`prefix` + 5 digits) for shrink variants."""
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter):05d}"
