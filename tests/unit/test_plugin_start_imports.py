"""What `draplugin run` imports before the kubelet's sockets open (`cli` parses and validates the
flags, `nodestart` starts `kubelet.server`, `kubelet.metrics` counts its calls): the API client
(urllib3 and its TLS set-up), the node daemon, the prepare path and the metrics exposition are
needed only behind the sockets, so none of them may be imported before. This checks the imports,
not the time (bench.prepare --part rss times it beside bench/plugin_floor.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

BEFORE_SOCKETS = (
    "import draplugin.cli, draplugin.nodestart, draplugin.kubelet.server, draplugin.kubelet.metrics"
)

ONLY_BEHIND_THE_SOCKETS = (
    "dracommon.kubeapi.client",
    "dracommon.kubeapi.rest",
    "dracommon.kubeapi.config",
    "urllib3",
    "kubernetes",
    "prometheus_client",
    "draplugin.node",
    "draplugin.prepare",
)


def _imported(code: str, watched: tuple[str, ...]) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_nothing_only_needed_behind_the_sockets_is_imported_before_them() -> None:
    assert _imported(BEFORE_SOCKETS, ONLY_BEHIND_THE_SOCKETS) == []


def test_the_api_package_still_gives_each_name_from_its_module() -> None:
    code = (
        "from dracommon.kubeapi import ApiError, KubeApi, load_api_client, watch_events\n"
        "assert ApiError.__module__ == 'dracommon.kubeapi.errors'\n"
        "assert KubeApi.__module__ == 'dracommon.kubeapi.client'\n"
        "assert load_api_client.__module__ == 'dracommon.kubeapi.config'\n"
        "assert watch_events.__module__ == 'dracommon.kubeapi.watch'"
    )
    assert _imported(code, ("dracommon.kubeapi.client",)) == ["dracommon.kubeapi.client"]
