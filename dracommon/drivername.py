"""Everything named after the driver, derived from its name by one rule.

The driver name is a setting (`--driver-name`, the chart's `driverName`), so the
opaque config API group, the CDI vendor and the controller's annotation keys
must follow it: a chart installed under another name that still expected
`gpu.draplugin.dev/v1alpha1` configs would reject every DeviceClass config it
renders itself. The plugin, the controller and the chart all apply this rule.
"""

from __future__ import annotations

from typing import Final

from dracommon.kubenames import dns_subdomain_problem

DEFAULT_DRIVER_NAME: Final = "gpu.draplugin.dev"
CONFIG_API_VERSION_SUFFIX: Final = "v1alpha1"
CDI_CLASS: Final = "gpu"

# A DNS subdomain (dracommon.kubenames), as the API server requires of a driver name, of at most
# 63 characters in resource.k8s.io.
MAX_DRIVER_NAME_LENGTH: Final = 63


class DriverNameError(ValueError):
    """The driver name is not a DNS subdomain of at most 63 characters."""


def check_driver_name(name: str) -> str:
    if len(name) > MAX_DRIVER_NAME_LENGTH or dns_subdomain_problem(name) is not None:
        raise DriverNameError(
            f"driver name {name!r} must be a lowercase DNS subdomain of at most "
            f"{MAX_DRIVER_NAME_LENGTH} characters (for example {DEFAULT_DRIVER_NAME})"
        )
    return name


def config_api_version(driver_name: str) -> str:
    """`apiVersion` of the opaque `GpuConfig` objects this driver accepts: `<driver>/v1alpha1`."""
    return f"{driver_name}/{CONFIG_API_VERSION_SUFFIX}"


def cdi_vendor(driver_name: str) -> str:
    """The CDI vendor of this driver's specs: the driver name itself (a valid CDI vendor)."""
    return driver_name


def cdi_kind(driver_name: str) -> str:
    """The CDI kind `<vendor>/<class>` of this driver's devices."""
    return f"{cdi_vendor(driver_name)}/{CDI_CLASS}"


def annotation_key(driver_name: str, name: str) -> str:
    """An annotation (or label) key in the driver's own prefix: `<driver>/<name>`."""
    return f"{driver_name}/{name}"


def reporting_controller(driver_name: str) -> str:
    """`reportingController` of the controller's Events: `<driver>/dra-controller`."""
    return f"{driver_name}/dra-controller"
