"""Which build is running: the package version for `--version`, start-up log lines and the
`*_build_info` metrics of both programs.

The version is the installed distribution's (`draplugin` in pyproject.toml: the image installs
it with pip, and `make` into the virtualenv), so it is the one place to bump. A checkout run
without installing (PYTHONPATH=.) has no metadata: it reports "unknown" rather than guessing.
"""

from __future__ import annotations

import platform
from typing import Final

DISTRIBUTION: Final = "draplugin"
UNKNOWN: Final = "unknown"


def version() -> str:
    # Imported here, not at the top: importlib.metadata (with the email package it pulls in)
    # is about 40 ms of every command's start-up, and only --version, the daemons' start log
    # line and the build_info metrics ask for the version.
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def version_line(prog: str) -> str:
    """`dra-controller 0.1.0 (Python 3.11.2)`: what `--version` prints."""
    return f"{prog} {version()} (Python {platform.python_version()})"


def build_labels() -> dict[str, str]:
    """The labels of the `*_build_info` gauges (`draplugin_build_info`, `dra_controller_build_info`),
    each always 1: the Prometheus convention for build information (as Go programs export
    `go_build_info`), so a query can join on it to tell which release each scraped process runs."""
    return {"version": version(), "python_version": platform.python_version()}
