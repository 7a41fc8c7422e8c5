"""What `draplugin run` imports before its sockets exist: the command line, the settings and the
plugin server, nothing of the daemon that is built behind the sockets (draplugin.nodestart).

The figures (start to sockets ready against the dra-example-driver plugin) come from
`python -m bench.prepare --part rss`; this checks the imports, not the time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Each tens of milliseconds of `python -X importtime` (or most of a second, `kubernetes`), and
# none needed to answer the kubelet's first calls (GetInfo, registration, liveness).
NOT_BEFORE_THE_SOCKETS = (
    "kubernetes",
    "prometheus_client",
    "urllib3",
    "pydantic",
    "yaml",
    "importlib.metadata",
    "draplugin.node",
    "draplugin.prepare",
    "draplugin.slices",
    "draplugin.usage",
    "draplugin.cdi.preview",
    "draplugin.devices.nvml",
    "draplugin.devices.fake",
)

# The `run` command line as `draplugin run` builds it, then what StagedNode.start imports
# before it binds the sockets.
START_PATH = """
from draplugin.cli import RUN_LINE
RUN_LINE.build_parser()
import draplugin.nodestart
"""


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {NOT_BEFORE_THE_SOCKETS!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_the_run_start_path_imports_nothing_the_sockets_do_not_need() -> None:
    assert _imported_after(START_PATH) == []


def test_the_probe_sees_what_the_daemon_imports() -> None:
    """The same probe after importing the daemon names those modules (it can fail)."""
    assert {"draplugin.node", "draplugin.slices", "draplugin.prepare"} <= set(
        _imported_after(START_PATH + "import draplugin.node\nimport draplugin.prepare.wiring\n")
    )


def test_run_help_is_the_run_parser_of_the_whole_command_line() -> None:
    """`draplugin run` parses with a parser of its own (no other subcommand module imported):
    its usage and options are those the whole command line gives `run`."""

    def run_help(main: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", main], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    alone = run_help("import sys; from draplugin.cli import main; sys.exit(main(['run', '--help']))")
    whole = run_help(
        "import sys; from draplugin.cli import COMMAND_LINE; sys.exit(COMMAND_LINE.main(['run', '--help']))"
    )
    assert alone == whole and "--kubelet-root-dir" in alone


def test_the_kubelet_layers_series_are_scraped_before_any_kubelet_call(tmp_path: Path) -> None:
    """Its metrics are made after the sockets open, not at import, and still before the endpoint
    serves: a scrape before the kubelet has called shows each of them."""
    import os
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DRAPLUGIN_DRIVER_FACTORY": "tests.kubelet_client:static_driver_factory"}
    root = Path(tempfile.mkdtemp(prefix="ps-", dir="/tmp"))  # short: socket paths have a 107-byte limit
    proc = subprocess.Popen(
        [sys.executable, "-m", "draplugin.cli", "run", "--node-name", "node-1", "--kubelet-root-dir",
         str(root), "--metrics-port", str(port)],
        cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the metrics endpoint never answered"
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    for name in (
        "draplugin_kubelet_claim_results",
        "draplugin_kubelet_request_seconds",
        "draplugin_kubelet_registration_notifications",
        "draplugin_kubelet_health_streams",
    ):
        assert f"# HELP {name}" in text, name
