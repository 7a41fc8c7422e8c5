"""Until `tests/nvmldouble.py` lands: the C-ABI NVML double (`tests/cluster/nvmldouble`) for these tests.

The real pynvml loads the double's `libnvidia-ml.so.1`; its configuration is the JSON file named by
`NVML_DOUBLE_CONFIG`. The Go runtime reads the environment the process started with (not what
Python sets later), so each test runs in a pytest process of its own started with that variable
(`in_own_process`), and writes its machine there with its own state file and procRoot. The
library comes from `NVML_DOUBLE_LIB` or is built once with Go.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "cluster" / "nvmldouble"
GO_NVML_HEADER_DIR = Path("/root/go/pkg/mod/github.com/!n!v!i!d!i!a/go-nvml@v0.13.4-1/pkg/nvml")
_INNER = "DRAPLUGIN_NVML_DOUBLE_INNER"
_built: list[Path] = []


def in_own_process(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    """True inside the test's own process (run the body); False outside, after that process passed."""
    if os.environ.get(_INNER) == "1":
        return True
    env = {
        **os.environ,
        _INNER: "1",
        "NVML_DOUBLE_CONFIG": str(tmp_path / "nvml-double.json"),
        "NVML_DOUBLE_LIB": str(library()),
    }
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", request.node.nodeid],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-6000:], done.stderr[-3000:])
    return False


def library() -> Path:
    """The double's library, built once per process when NVML_DOUBLE_LIB names none."""
    given = os.environ.get("NVML_DOUBLE_LIB")
    if given:
        return Path(given)
    if _built:
        return _built[0]
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None or not SOURCE.is_dir():
        pytest.skip("no Go toolchain or NVML double source to build it")
    out = Path(tempfile.mkdtemp(prefix="draplugin-nvml-double-")) / "libnvidia-ml.so.1"
    env = {
        **os.environ,
        "CGO_CFLAGS": f"-I{GO_NVML_HEADER_DIR} -Wno-deprecated-declarations",
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
    }
    subprocess.run(
        [go, "build", "-buildmode=c-shared", "-o", str(out), "."],
        cwd=SOURCE,
        env=env,
        check=True,
        capture_output=True,
    )
    _built.append(out)
    return out


def configure(tmp_path: Path, **config: Any) -> Path:
    """Write this test's machine (fresh state file and procRoot); returns the procRoot."""
    proc = tmp_path / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    doc = {"stateFile": str(tmp_path / "nvml.state"), "procRoot": str(proc), **config}
    path = Path(os.environ["NVML_DOUBLE_CONFIG"])
    path.write_text(json.dumps(doc))
    return proc


def state(tmp_path: Path) -> dict[str, Any]:
    """The double's shared state (MIG mode, GPU and compute instances), as the driver keeps it."""
    return dict(json.loads((tmp_path / "nvml.state").read_text()))
