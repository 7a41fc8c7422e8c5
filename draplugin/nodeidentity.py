"""Who this plugin is: its Node's name, checked once, and the writer identity of the machine it runs on.

The node name must be the name of a Node object, and the API server only
stores Nodes whose names are RFC 1123 DNS subdomains (at most 253 characters
of lower-case letters, digits, '-' and '.', each dot-separated part starting
and ending alphanumeric). A name that breaks the rule can never match the
kubelet's Node, so `draplugin run` refuses it before anything starts. The
kubelet itself lower-cases a host name it registers under (`--hostname-override`
or the machine's host name), so a name that is only wrong by its case gets that
hint.

The writer identity marks the ResourceSlices this plugin writes
(`draplugin.slices.writer`). It is a random id kept in the state directory, not
the pod UID or an id per process: the state directory is the node's own
(a hostPath in the chart), so a restarted container, a new plugin pod of a
rolling update (which runs beside the old one for a while) and a plugin that
comes back after a reboot all keep the same id and never take each other for a
second node, while two machines that were given one node name have separate
state directories and so different ids.

Imported by the settings (`draplugin.config`) before the kubelet's sockets
open: standard library and `dracommon.kubenames` only.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Final

from dracommon.kubenames import dns_subdomain_problem

log = logging.getLogger(__name__)

WRITER_ID_FILE: Final = "writer-id"
_WRITER_ID: Final = re.compile(r"[0-9a-f]{16,64}")


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot be a Node's name (a sentence that quotes it), or None when it can."""
    problem = dns_subdomain_problem(name)
    if problem is None:
        return None
    text = f"{name!r} {problem}: it cannot be the name of a Node"
    lowered = name.lower()
    if lowered != name and dns_subdomain_problem(lowered) is None:
        text += f" (the kubelet registers a host name in lower case: {lowered!r})"
    return text


def writer_id(state_dir: Path) -> str:
    """This machine's writer identity, made once and kept in `state_dir`.

    Two plugins that start at once on one machine (the pods of a rolling update)
    agree on it: the file is made complete under a temporary name and linked into
    place, so the first link wins and the other reads the winner's id.
    """
    path = state_dir / WRITER_ID_FILE
    existing = _read(path)
    if existing is not None:
        return existing
    import secrets  # here: the settings import this module before the sockets open

    state_dir.mkdir(parents=True, exist_ok=True)
    fresh = secrets.token_hex(8)
    staged = state_dir / f".{WRITER_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    staged.write_text(fresh + "\n")
    try:
        os.link(staged, path)
    except FileExistsError:
        kept = _read(path)
        if kept is not None:
            return kept
        log.warning("writer id file was unreadable: replaced", extra={"path": str(path)})
        os.replace(staged, path)
        return fresh
    finally:
        staged.unlink(missing_ok=True)
    return fresh


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text if _WRITER_ID.fullmatch(text) else None
