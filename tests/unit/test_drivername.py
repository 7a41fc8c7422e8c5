"""One rule names everything after the driver; the chart's templates spell the same rule.

The chart is rendered by Helm only in tests/integration/test_chart.py; here the
templates are read as text, so a template that stops following the rule (a
hard-coded `gpu.draplugin.dev/v1alpha1`, say) fails without Helm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dracommon.drivername import (
    DEFAULT_DRIVER_NAME,
    DriverNameError,
    annotation_key,
    cdi_kind,
    cdi_vendor,
    check_driver_name,
    config_api_version,
    reporting_controller,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "draplugin" / "templates"


@pytest.mark.parametrize("driver", [DEFAULT_DRIVER_NAME, "gpu.example.com"])
def test_every_name_is_derived_from_the_driver_name(driver: str) -> None:
    assert config_api_version(driver) == f"{driver}/v1alpha1"
    assert cdi_vendor(driver) == driver
    assert cdi_kind(driver) == f"{driver}/gpu"
    assert annotation_key(driver, "preallocate") == f"{driver}/preallocate"
    assert reporting_controller(driver) == f"{driver}/dra-controller"


def test_the_default_is_the_projects_name() -> None:
    assert DEFAULT_DRIVER_NAME == "gpu.draplugin.dev"
    assert config_api_version(DEFAULT_DRIVER_NAME) == "gpu.draplugin.dev/v1alpha1"


@pytest.mark.parametrize("good", ["gpu.draplugin.dev", "a", "gpu-1.example.com", "a" * 63])
def test_valid_driver_names_pass_unchanged(good: str) -> None:
    assert check_driver_name(good) == good


@pytest.mark.parametrize(
    "bad", ["", "GPU.example.com", "gpu_x", "-gpu", "gpu.", "a" * 64, "gpu/x", "gpu.example.com\n"]
)
def test_invalid_driver_names_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(DriverNameError, match="must be a lowercase DNS subdomain of at most 63 characters"):
        check_driver_name(bad)


def test_the_charts_device_class_configs_use_the_rules_api_version() -> None:
    template = (TEMPLATES / "deviceclasses.yaml").read_text()
    assert "{{- $driver := .Values.driverName }}" in template
    assert f"apiVersion: {config_api_version('{{ $driver }}')}" in template
    assert "driver: {{ $driver }}" in template


def test_no_template_hard_codes_the_default_driver_name() -> None:
    offenders = [p.name for p in sorted(TEMPLATES.iterdir()) if DEFAULT_DRIVER_NAME in p.read_text()]
    assert offenders == []
