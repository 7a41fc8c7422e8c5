"""`python -m draplugin.usage.dcgmrules [--check]`: the recording rules that give our usage series
DCGM exporter's names, units and labels, so Grafana dashboards built for DCGM work unchanged.

Written to `deploy/monitoring/dcgm-compat.rules.yaml` (a plain Prometheus rules file) and to the
chart's copy, `deploy/helm/draplugin/rules/dcgm-compat.rules.yaml`, which its PrometheusRule
(`metrics.prometheusRule.enabled`) embeds: Helm reads files inside the chart only. `--check` exits
1 when either file differs from what this module says (tests run it).

DCGM exporter's side, from NVIDIA/dcgm-exporter `etc/default-counters.csv` (names, types, units)
and its exposition (labels `gpu` = the GPU index, `UUID`, `device` = `nvidia<index>`,
`modelName`, `Hostname`, and `namespace`, `pod`, `container` of the pod using the GPU):

| DCGM series | unit | ours |
| --- | --- | --- |
| `DCGM_FI_DEV_GPU_UTIL` | % | `draplugin_device_gpu_utilization_ratio` x 100 |
| `DCGM_FI_DEV_MEM_COPY_UTIL` | % | `draplugin_device_memory_utilization_ratio` x 100 |
| `DCGM_FI_DEV_FB_USED` | MiB | `draplugin_device_memory_used_bytes` / 2^20 |
| `DCGM_FI_DEV_FB_FREE` | MiB | (`..._memory_total_bytes` - `..._memory_used_bytes`) / 2^20 |
| `DCGM_FI_DEV_POWER_USAGE` | W | `draplugin_device_power_watts` |
| `DCGM_FI_DEV_GPU_TEMP` | C | `draplugin_device_temperature_celsius` |
| `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL` | count | `draplugin_device_ecc_errors_total{type="corrected"}` |
| `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` | count | `draplugin_device_ecc_errors_total{type="uncorrected"}` |

Whole GPUs only (devices named `gpu-<n>`): DCGM reports a MIG device under its parent's `gpu` and
`UUID` with `GPU_I_ID`/`GPU_I_PROFILE` labels, which our series do not carry, and NVML gives MIG
devices no utilization anyway. A GPU held by claims gets one series per pod and container using
it (from our claim series), as DCGM exporter's pod mapping gives; an unheld GPU gets one series
without them. `DCGM_FI_DEV_XID_ERRORS` (the last XID as a value) has no equivalent: our XIDs are
a counter per XID label.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from dracommon import usagenames as names

REPO: Final = Path(__file__).resolve().parents[2]
RULES_PATH: Final = REPO / "deploy" / "monitoring" / "dcgm-compat.rules.yaml"
CHART_RULES_PATH: Final = REPO / "deploy" / "helm" / "draplugin" / "rules" / "dcgm-compat.rules.yaml"
GROUP: Final = "draplugin-dcgm-compat"

MIB: Final = 1024 * 1024
# Our device labels kept while joining, then dropped: DCGM's names for them replace them.
_OURS: Final = f"{names.NODE}, {names.UUID}, {names.DEVICE}, {names.MODEL}"
WHOLE_GPU: Final = f'{names.DEVICE}=~"gpu-[0-9]+"'


@dataclass(frozen=True, slots=True)
class DcgmSeries:
    """One DCGM exporter series: its name, DCGM's help text, and our value in its unit (PromQL)."""

    name: str
    help: str
    value: str


def _device(metric: str, *matchers: str) -> str:
    """One series per whole GPU: the scrape target's labels (job, instance, and the plugin pod's
    namespace/pod that a ServiceMonitor adds) dropped, so two plugin pods during a rollout make
    one series, not two."""
    selector = ", ".join((WHOLE_GPU, *matchers))
    return f"max by ({_OURS}) ({metric}{{{selector}}})"


SERIES: Final = (
    DcgmSeries(
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        f"100 * {_device(names.DEVICE_GPU_UTILIZATION.exposed)}",
    ),
    DcgmSeries(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        f"100 * {_device(names.DEVICE_MEMORY_UTILIZATION.exposed)}",
    ),
    DcgmSeries(
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        f"{_device(names.DEVICE_MEMORY_USED.exposed)} / {MIB}",
    ),
    DcgmSeries(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        f"({_device(names.DEVICE_MEMORY_TOTAL.exposed)}"
        f" - {_device(names.DEVICE_MEMORY_USED.exposed)}) / {MIB}",
    ),
    DcgmSeries("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _device(names.DEVICE_POWER.exposed)),
    DcgmSeries("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _device(names.DEVICE_TEMPERATURE.exposed)),
    DcgmSeries(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        _device(names.DEVICE_ECC_ERRORS.exposed, 'type="corrected"'),
    ),
    DcgmSeries(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        _device(names.DEVICE_ECC_ERRORS.exposed, 'type="uncorrected"'),
    ),
)

# The pods (and containers) using each whole GPU, one series per holder, from our claim series:
# recorded first, the rules below (evaluated after it, in order) join on it.
HOLDERS: Final = "draplugin:gpu_holders:group"
_CLAIM_SERIES: Final = f"{names.CLAIM_GPU_UTILIZATION.exposed}|{names.CLAIM_MEMORY_USED.exposed}"
_HOLDERS_EXPR: Final = (
    f"group by ({names.NODE}, {names.UUID}, {names.NAMESPACE}, {names.POD}, {names.CONTAINER}) (\n"
    f'  {{__name__=~"{_CLAIM_SERIES}", {WHOLE_GPU}}}\n'
    ")"
)

# (label, source label, regex, replacement): DCGM's labels made from ours, `device` last (it
# reads our `device`, which it replaces).
_RENAMES: Final = (
    ("gpu", names.DEVICE, "gpu-([0-9]+)", "$1"),
    ("UUID", names.UUID, "(.+)", "$1"),
    ("modelName", names.MODEL, "(.+)", "$1"),
    ("Hostname", names.NODE, "(.+)", "$1"),
    ("device", names.DEVICE, "gpu-([0-9]+)", "nvidia$1"),
)


def expression(series: DcgmSeries) -> str:
    """Each holder of a GPU gets the GPU's value under its pod's labels; an unheld GPU gets it bare."""
    on = f"on ({names.NODE}, {names.UUID})"
    lines = [
        f"max without ({names.NODE}, {names.UUID}, {names.MODEL}) (",
        "  " + "label_replace(" * len(_RENAMES),
        "    (",
        f"        {HOLDERS} * {on} group_left ({names.DEVICE}, {names.MODEL}) ({series.value})",
        "      or",
        f"        ({series.value}) unless {on} {HOLDERS}",
        "    ),",
        # Each closes one label_replace, the innermost first.
        *(f'  "{label}", "{repl}", "{source}", "{regex}"),' for label, source, regex, repl in _RENAMES),
        ")",
    ]
    lines[-2] = lines[-2].removesuffix(",")
    return "\n".join(lines) + "\n"


def rules() -> dict[str, object]:
    return {
        "groups": [
            {
                "name": GROUP,
                "rules": [
                    {"record": HOLDERS, "expr": _Literal(_HOLDERS_EXPR + "\n")},
                    *({"record": s.name, "expr": _Literal(expression(s))} for s in SERIES),
                ],
            }
        ]
    }


class _Literal(str):
    """A multi-line string YAML writes as a `|` block, so the rules file reads like PromQL."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


HEADER: Final = """\
# Generated by `python -m draplugin.usage.dcgmrules` from the code; do not edit by hand.
# Recording rules that expose the node plugin's usage series under DCGM exporter's names, units
# and labels (gpu, UUID, device, modelName, Hostname; namespace, pod, container of the pods using
# the GPU), so dashboards built for DCGM exporter work unchanged. docs/metrics.md says how.
"""


class _RulesDumper(yaml.SafeDumper):
    pass


_RulesDumper.add_representer(_Literal, _literal)


def render() -> str:
    return HEADER + yaml.dump(rules(), Dumper=_RulesDumper, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draplugin.usage.dcgmrules", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rules file is stale")
    args = parser.parse_args(argv)
    text = render()
    stale = [p for p in (RULES_PATH, CHART_RULES_PATH) if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m draplugin.usage.dcgmrules", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
