"""`kubectl dra` with the real kubectl: kubectl finds `kubectl-dra` on PATH and runs it as a plugin,
and its shell completion asks `kubectl_complete-dra` (kubectl's plugin completion, 1.26+), both
as the package installs them. No API server is needed: kubectl reads no cluster for either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.binaries import MissingBinariesError, bin_dir, require_binaries

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(sys.executable).parent
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")
OBJECTS = [
    "-f",
    "examples/deviceclasses.yaml",
    "-f",
    "examples/resourceslices/",
    "-f",
    "examples/05-same-pcie-root/",
]


@pytest.fixture(scope="module")
def kubectl_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = bin_dir()
    try:
        require_binaries(directory, ("kubectl",))
    except MissingBinariesError as err:
        pytest.fail(str(err), pytrace=False)
    home = tmp_path_factory.mktemp("home")
    # Only our entry points and that kubectl on PATH (plus the system's, for bash); no user kubeconfig.
    path = os.pathsep.join([str(BIN_DIR), str(directory), "/usr/bin", "/bin"])
    return {"PATH": path, "HOME": str(home), "KUBECONFIG": str(home / "absent")}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_kubectl_runs_the_plugin(kubectl_env: dict[str, str]) -> None:
    listed = _run(["kubectl", "plugin", "list"], kubectl_env)
    assert f"{BIN_DIR}/kubectl-dra" in listed.stdout, listed.stdout + listed.stderr
    usage = _run(["kubectl", "dra", "--help"], kubectl_env)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: kubectl dra "), usage.stderr
    explained = _run(["kubectl", "dra", "explain", "pod/gpu-pair", *OBJECTS], kubectl_env)
    assert explained.returncode == 0, explained.stderr
    assert "pod default/gpu-pair" in explained.stdout


@pytest.mark.parametrize(
    ("words", "expected"),
    [(["dra", "ex"], ["explain"]), (["dra", "explain", "--all"], ["--all-namespaces"])],
)
def test_kubectl_completes_the_plugins_words(
    words: list[str], expected: list[str], kubectl_env: dict[str, str]
) -> None:
    # What kubectl's completion script runs on TAB: `kubectl __complete WORD... PARTIAL`.
    done = _run(["kubectl", "__complete", *words], kubectl_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [*expected, ":4"], done.stderr


def test_tab_after_kubectl_dra_in_bash(kubectl_env: dict[str, str]) -> None:
    # kubectl's bash completion, loaded as its docs say (over bash-completion, which it needs:
    # tests/cluster/install_debs.sh installs Debian's), then what bash does on TAB.
    assert BASH_COMPLETION.is_file(), f"{BASH_COMPLETION} is missing: run tests/cluster/install_debs.sh"
    script = (
        f"source {BASH_COMPLETION}\n"
        "source <(kubectl completion bash)\n"
        "COMP_WORDS=(kubectl dra explain --nam); COMP_CWORD=3; COMP_LINE='kubectl dra explain --nam'\n"
        "COMP_POINT=${#COMP_LINE}\n"
        "__start_kubectl kubectl --nam kubectl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = _run(["bash", "-c", script], kubectl_env)
    assert done.stdout.split() == ["--namespace"], done.stdout + done.stderr
