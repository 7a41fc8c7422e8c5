"""Reading a config back from the checkpoint (`GpuConfig.to_json`), mostly without the validator.

Apart from `gpuconfig` (the values, which the validator imports) so that neither of the two
modules imports the other: this one needs both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draplugin.prepare.gpuconfig import KIND, GpuConfig, SharingStrategy, default_config


def read_stored_config(doc: Mapping[str, Any], path: str, *, api_version: str) -> GpuConfig:
    """A config the checkpoint holds (`GpuConfig.to_json`); `ConfigError` when it is not valid.

    Most claims are prepared with the default config, so most stored documents are its canonical
    form: that one is the default without the validator (and without importing pydantic). The
    comparison is exact, on plain JSON types, so it takes only a document the validator would
    read as the default; anything else is validated.
    """
    if _is_default_document(doc, api_version):
        return default_config(api_version)
    # Imported here, not at the top: only a document other than the default needs the validator,
    # and it brings pydantic, which a plugin without opaque configs otherwise never loads.
    from draplugin.prepare.claimconfig import validate_opaque_config

    return validate_opaque_config(dict(doc), path, api_version=api_version)


def _is_default_document(doc: Mapping[str, Any], api_version: str) -> bool:
    # type() is, not ==: a str subclass (an enum member) or a dict subclass is left to the validator.
    if type(doc) is not dict or len(doc) != 3:
        return False
    sharing = doc.get("sharing")
    return (
        type(doc.get("apiVersion")) is str
        and doc["apiVersion"] == api_version
        and type(doc.get("kind")) is str
        and doc["kind"] == KIND
        and type(sharing) is dict
        and len(sharing) == 1
        and type(sharing.get("strategy")) is str
        and sharing["strategy"] == SharingStrategy.EXCLUSIVE.value
    )
