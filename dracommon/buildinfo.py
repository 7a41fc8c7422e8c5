"""Which build is running: the package version for `--version`, start-up log lines and the
`*_build_info` metrics of both programs.

The version is the installed distribution's (`draplugin` in pyproject.toml: the image installs
it with pip, and `make` into the virtualenv), so it is the one place to bump. A checkout run
without installing (PYTHONPATH=.) has no metadata: it reports "unknown" rather than guessing.
"""

from __future__ import annotations

import os
import sys
from typing import Final

DISTRIBUTION: Final = "draplugin"
UNKNOWN: Final = "unknown"


def version() -> str:
    found = _dist_info_version()
    if found is not None:
        return found
    # Imported here, not at the top: importlib.metadata (with the email, zipfile and csv modules
    # it pulls in) is 10 to 40 ms of a command's start-up and about 1 MiB of its memory; the
    # daemons' start log line asks for the version before the kubelet plugin's sockets open.
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def _dist_info_version() -> str | None:
    """The `Version:` of the first `draplugin-*.dist-info/METADATA` on sys.path, searched in
    sys.path's order as importlib.metadata searches it; None where the first match is anything
    else (an egg-info, a zip, no match at all): importlib.metadata then answers."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            lowered = name.lower()
            if lowered.startswith(DISTRIBUTION + "-") and lowered.endswith(".dist-info"):
                return _metadata_version(os.path.join(entry or ".", name, "METADATA"))
            if lowered.startswith((DISTRIBUTION + "-", DISTRIBUTION + ".")) and lowered.endswith(".egg-info"):
                return None
    return None


def _metadata_version(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as metadata_file:
            for line in metadata_file:
                if not line.strip():
                    break  # the headers end at the first blank line
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "version":
                    return value.strip()
    except (OSError, UnicodeDecodeError):
        pass
    return None


def version_line(prog: str) -> str:
    """`dra-controller 0.1.0 (Python 3.11.2)`: what `--version` prints."""
    import platform  # here: a millisecond of the plugin's start before its sockets, unused there

    return f"{prog} {version()} (Python {platform.python_version()})"


def build_labels() -> dict[str, str]:
    """The labels of the `*_build_info` gauges (`draplugin_build_info`, `dra_controller_build_info`),
    each always 1: the Prometheus convention for build information (as Go programs export
    `go_build_info`), so a query can join on it to tell which release each scraped process runs."""
    import platform

    return {"version": version(), "python_version": platform.python_version()}
