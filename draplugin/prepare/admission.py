"""A ValidatingAdmissionPolicy (CEL) for our opaque config, generated from the one `GpuConfig` schema.

The API server then refuses a ResourceClaim, ResourceClaimTemplate or
DeviceClass whose `GpuConfig` prepare would refuse, with the same field path
and message (`validate_opaque_config`), at create time instead of when a pod
is already waiting. Prepare keeps its own validation: the policy is an early
warning (it can be turned off, and it does not see objects made before it).

The expressions come from `gpu_config_json_schema`: for each object its type,
then its properties in order (required ones, enums, consts, integer ranges,
Kubernetes quantities, maps keyed by device names), then unknown fields,
which is pydantic's order, so the first message is the one prepare gives. The
one cross-field rule the schema cannot say (a settings block must match the
strategy) is `_STRATEGY_BLOCKS`, next to the schema walk. Each config's
checks form one CEL expression that yields "" or the first message (the server's CEL has
no `cel.bind` in admission policies: a one-element `map()` binds instead).

`python -m draplugin.prepare.admission` prints the chart template
(deploy/helm/draplugin/templates/claimconfig-policy.yaml); a unit test keeps
the committed file equal to it.
"""

from __future__ import annotations

import json
import sys
import typing
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import WithJsonSchema

from dracommon.drivername import config_api_version
from draplugin.prepare.claimconfig import GpuConfig, MemoryBytes, gpu_config_json_schema
from draplugin.prepare.gpuconfig import SharingStrategy

# The driver name in the generated template: Helm fills in .Values.driverName.
_DRIVER_PLACEHOLDER = "driver.placeholder.invalid"
_HELM_DRIVER = "{{ .Values.driverName }}"

# A settings block is only allowed with its strategy (claimconfig.Sharing._matches_strategy).
_STRATEGY_BLOCKS = {"timeSlicingConfig": SharingStrategy.TIME_SLICING, "mpsConfig": SharingStrategy.MPS}
_DEFAULT_STRATEGY = SharingStrategy.EXCLUSIVE
# Where each kind keeps its device configs, and how its paths are written.
_CONFIG_LISTS = (
    ("ResourceClaimTemplate", "object.spec.?spec.?devices.?config.orValue([])", "spec.spec.devices.config"),
    ("DeviceClass", "object.spec.?config.orValue([])", "spec.config"),
    ("ResourceClaim", "object.spec.?devices.?config.orValue([])", "spec.devices.config"),
)
_QUANTITY_SCHEMA = next(m.json_schema for m in typing.get_args(MemoryBytes) if isinstance(m, WithJsonSchema))
_MAX_MEMORY = "1Ei"  # claimconfig._MAX_MEMORY_BYTES


def _lit(text: str) -> str:
    """A CEL string literal (JSON escaping is valid CEL)."""
    return json.dumps(text)


def _type_name(v: str) -> str:
    """claimconfig._type_name in CEL."""
    return (
        f'(type({v}) == null_type ? "null" : type({v}) == bool ? "boolean" : '
        f'(type({v}) == int || type({v}) == uint || type({v}) == double) ? "number" : '
        f'type({v}) == string ? "string" : type({v}) == list ? "array" : '
        f'type({v}) == map ? "object" : "unknown")'
    )


def _repr(v: str) -> str:
    """Python's repr() of a JSON scalar, as pydantic's messages print the value."""
    return (
        f'(type({v}) == string ? "\'" + {v} + "\'" : type({v}) == null_type ? "None" : '
        f'type({v}) == bool ? ({v} ? "True" : "False") : '
        f"(type({v}) == int || type({v}) == double) ? string({v}) : {_type_name(v)})"
    )


def _first(*checks: str) -> str:
    """The first non-empty message of the checks; each is evaluated once and must not fail."""
    return "([" + ", ".join(checks) + '].filter(m, m != "") + [""])[0]'


def _bind(name: str, value: str, body: str) -> str:
    """`body` with `name` bound to `value`. The API server's CEL has no cel.bind in admission
    policies; a one-element map() binds its iteration variable the same way."""
    return f"[{value}].map({name}, {body})[0]"


class _Generator:
    def __init__(self, schema: Mapping[str, Any], literals: frozenset[str]) -> None:
        self.defs = schema.get("$defs", {})
        self.schema = schema
        self.literals = literals
        self.depth = 0

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        if "$ref" in schema:
            return dict(self.defs[schema["$ref"].rsplit("/", 1)[1]])
        return schema

    def _var(self) -> str:
        self.depth += 1
        return f"v{self.depth}"

    def check(self, schema: Mapping[str, Any], v: str, path: str, name: str = "") -> str:
        """CEL: "" if the value `v` (at the path expression `path`) is valid, else the message."""
        schema = self.resolve(schema)
        if schema == _QUANTITY_SCHEMA:
            return self._quantity(v, path)
        if "anyOf" in schema:
            options = [o for o in schema["anyOf"] if o != {"type": "null"}]
            nullable = len(options) < len(schema["anyOf"])
            inner = {"anyOf": options} if len(options) > 1 else options[0]
            body = self.check(inner, v, path, name)
            return f'(type({v}) == null_type ? "" : {body})' if nullable else body
        if schema.get("type") == "object" and "patternProperties" in schema:
            return self._device_map(schema, v, path)
        if schema.get("type") == "object":
            return self._object(schema, v, path)
        if "enum" in schema:
            choices = ", ".join(schema["enum"])
            allowed = "[" + ", ".join(_lit(e) for e in schema["enum"]) + "]"
            wrong = _lit(": must be one of " + choices + ", got ")
            return f'({v} in {allowed} ? "" : {path} + {wrong} + {_repr(v)})'
        if "const" in schema:
            const = schema["const"]
            mismatch = (
                f'({v} == {_lit(const)} ? "" : {path} + {_lit(f": must be {const!r}, got ")} + {_repr(v)})'
            )
            if name in self.literals:
                return mismatch  # a Literal field: any other value, of any type, is a literal error
            return (
                f'(type({v}) != string ? {path} + ": must be a string, got " + {_type_name(v)} : {mismatch})'
            )
        if schema.get("type") == "integer":
            low, high = schema["minimum"], schema["maximum"]
            return (
                f'(type({v}) == double ? {path} + ": must be an integer, got " + string({v}) : '
                f'type({v}) != int ? {path} + ": must be an integer, got " + {_type_name(v)} : '
                f"({v} < {low} || {v} > {high}) ? {path} + "
                f'{_lit(f": must be between {low} and {high}, got ")} + string({v}) : "")'
            )
        raise ValueError(f"no CEL for schema {schema!r}")  # a new kind of field: teach the generator

    def _object(self, schema: Mapping[str, Any], v: str, path: str) -> str:
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        checks = []
        for prop, prop_schema in properties.items():
            field_path = f"{path} + {_lit('.' + prop)}"
            item = self._var()
            own = self.check(prop_schema, item, field_path, prop)
            if prop in _STRATEGY_BLOCKS:
                own = _first(own, self._strategy_rule(v, prop, field_path))
            missing = _lit("") if prop not in required else f'{field_path} + ": required field is missing"'
            checks.append(f"({_lit(prop)} in {v} ? {_bind(item, f'{v}[{_lit(prop)}]', own)} : {missing})")
        if schema.get("additionalProperties") is False:
            names = "[" + ", ".join(_lit(p) for p in properties) + "]"
            allowed = ", ".join(properties)
            checks.append(
                f'({v}.all(k, k in {names}) ? "" : {path} + "." + {v}.filter(k, !(k in {names}))[0] + '
                f"{_lit(': unknown field (allowed: ' + allowed + ')')})"
            )
        return (
            f'(type({v}) != map ? {path} + ": must be an object, got " + {_type_name(v)} : {_first(*checks)})'
        )

    def _strategy_rule(self, sharing: str, block: str, block_path: str) -> str:
        wanted = _STRATEGY_BLOCKS[block].value
        strategies = "[" + ", ".join(_lit(s.value) for s in SharingStrategy) + "]"
        strategy = f'("strategy" in {sharing} ? {sharing}["strategy"] : {_lit(_DEFAULT_STRATEGY.value)})'
        return (
            f'(!({strategy} in {strategies}) || {strategy} == {_lit(wanted)} ? "" : {block_path} + '
            f"{_lit(': is only allowed with strategy ' + wanted + ', strategy is ')} + string({strategy}))"
        )

    def _quantity(self, v: str, path: str) -> str:
        text = f"string({v})"
        shown = f'"\'" + {text} + "\'"'
        return (
            f"(type({v}) != string && type({v}) != int ? {path} + "
            f"\": must be a quantity string such as '4Gi', got \" + {_type_name(v)} : "
            f'!isQuantity({text}) ? {path} + ": " + {shown} + '
            f"\" is not a Kubernetes quantity (e.g. '512Mi', '4Gi', '10G')\" : "
            f'quantity({text}).compareTo(quantity("0")) <= 0 ? '
            f'{path} + ": must be a positive amount of memory, got " + {shown} : '
            f'quantity({text}).compareTo(quantity("{_MAX_MEMORY}")) > 0 ? {path} + ": " + {shown} + '
            f'" is larger than any GPU memory" : "")'
        )

    def _device_map(self, schema: Mapping[str, Any], v: str, path: str) -> str:
        ((pattern, value_schema),) = schema["patternProperties"].items()
        key_path = f'{path} + "[" + k + "]"'
        value = self._var()
        values = self.check(value_schema, value, key_path)
        return (
            f'(type({v}) != map ? {path} + ": must be an object, got " + {_type_name(v)} : '
            f"{v}.exists(k, !k.matches({_lit(pattern)})) ? "
            f'{path} + "[" + {v}.filter(k, !k.matches({_lit(pattern)}))[0] + '
            f'"]: key must be a device name (a DNS label, e.g. gpu-0)" : '
            f'({v}.map(k, {_bind(value, f"{v}[k]", values)}).filter(m, m != "") + [""])[0])'
        )


def _literal_fields() -> frozenset[str]:
    """Top-level fields whose type is a Literal (kind): their const check has no string check first."""
    fields = GpuConfig.model_fields.items()
    return frozenset(f.alias or n for n, f in fields if typing.get_origin(f.annotation) is typing.Literal)


def config_check(driver_name: str) -> str:
    """CEL over `params` (one config's parameters) and `path`: "" or prepare's message."""
    return _Generator(gpu_config_json_schema(driver_name), _literal_fields()).check(
        gpu_config_json_schema(driver_name), "params", "path"
    )


def policy_objects(driver_name: str, name: str) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (Deny) for this driver's configs."""
    lists = "".join(f'object.kind == "{kind}" ? {expr} : ' for kind, expr, _ in _CONFIG_LISTS[:-1])
    roots = "".join(f'object.kind == "{kind}" ? "{root}" : ' for kind, _, root in _CONFIG_LISTS[:-1])
    problems = (
        "variables.configs.transformList(i, c, "
        f"has(c.opaque) && c.opaque.driver == {_lit(driver_name)}, "
        + _bind(
            "params",
            "c.opaque.parameters",
            _bind(
                "path", 'variables.root + "[" + string(i) + "].opaque.parameters"', config_check(driver_name)
            ),
        )
        + ').filter(m, m != "")'
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
                    }
                ]
            },
            "variables": [
                {"name": "configs", "expression": lists + _CONFIG_LISTS[-1][1]},
                {"name": "root", "expression": roots + _lit(_CONFIG_LISTS[-1][2])},
                {"name": "problems", "expression": problems},
            ],
            "validations": [
                {
                    "expression": "size(variables.problems) == 0",
                    "messageExpression": "string(variables.problems[0])",
                    "reason": "Invalid",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


CHART_HEADER = """\
{{- if .Values.claimConfigPolicy.enabled }}
{{- $name := include "draplugin.clusterName" (dict "root" . "suffix" "claim-config") }}
# Generated by `python -m draplugin.prepare.admission` from the GpuConfig schema: do not edit.
# Refuses ResourceClaims, ResourceClaimTemplates and DeviceClasses whose opaque GpuConfig
# prepare would refuse, with prepare's field path and message. Prepare validates again.
"""


def chart_template() -> str:
    """The chart's template: the policy for a placeholder driver, then Helm's names put in."""
    docs = policy_objects(_DRIVER_PLACEHOLDER, "NAME_PLACEHOLDER")
    body = "---\n".join(yaml.safe_dump(doc, sort_keys=False, width=10_000) for doc in docs)
    body = body.replace(config_api_version(_DRIVER_PLACEHOLDER), f"{_HELM_DRIVER}/v1alpha1")
    body = body.replace(_DRIVER_PLACEHOLDER, _HELM_DRIVER).replace("NAME_PLACEHOLDER", "{{ $name }}")
    return CHART_HEADER + body + "{{- end }}\n"


if __name__ == "__main__":
    sys.stdout.write(chart_template())
