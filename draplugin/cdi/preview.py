"""The spec prepare would write for a made-up claim: `draplugin cdi-spec` and `make gpu-check`.

The claim holds the given devices under one request with the default config
and goes through prepare's own functions (`plan_claim`, the driver files,
`render_spec`), so what comes out is what such a claim's containers get.
Imports nothing outside the standard library and the package, for the GPU check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dracommon.drivername import cdi_kind
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.spec import Spec
from draplugin.devices.model import Device
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.plan import plan_claim, render_spec

# The made-up claim. Its UID names the CDI devices (`<uid>-gpu-0`); a real claim's differs.
PREVIEW_CLAIM = ClaimRef(namespace="default", uid="00000000-0000-0000-0000-000000000000", name="cdi-spec")
PREVIEW_REQUEST = "gpu"


def preview_claim(driver: str, pool: str, devices: Sequence[str]) -> dict[str, Any]:
    """ResourceClaim JSON as the API server would return it with `devices` allocated on `pool`."""
    results = [{"request": PREVIEW_REQUEST, "driver": driver, "pool": pool, "device": d} for d in devices]
    return {
        "metadata": {
            "namespace": PREVIEW_CLAIM.namespace,
            "name": PREVIEW_CLAIM.name,
            "uid": PREVIEW_CLAIM.uid,
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def preview_spec(
    devices: Mapping[str, Device],
    names: Sequence[str],
    *,
    driver: str,
    node: str,
    driver_files: DriverFiles | None,
) -> Spec:
    """The spec of a claim holding `names`; raises `PlanError` or `DriverRootError` like prepare."""
    kind = cdi_kind(driver)
    doc = preview_claim(driver, node, names)
    plan = plan_claim(PREVIEW_CLAIM, doc, driver=driver, pool=node, devices=devices, kind=kind)
    driver_edits = driver_files.edits() if driver_files is not None else None
    return render_spec(plan, None, kind, driver_edits)
