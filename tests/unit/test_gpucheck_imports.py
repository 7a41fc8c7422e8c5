"""`make gpu-check` on a bare GPU machine: the package's source and nvidia-ml-py, nothing else.

Each case runs a fresh interpreter with `-I -S` (no site-packages, no
environment), a path of only the repository and a directory holding a copy of
`pynvml.py`, and an import hook that refuses PyYAML, pydantic, grpc, protobuf
and the Kubernetes client, so an import of any of them anywhere in what the
check runs fails the case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml

from draplugin.gpucheck.table import OK, SKIPPED
from tests.unit.test_gpucheck import SMI_XML

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("yaml", "pydantic", "pydantic_core", "grpc", "google", "kubernetes")

PRELUDE = """
import sys
sys.path[:0] = {path!r}
FORBIDDEN = {forbidden!r}
refused = []

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            refused.append(name)
            raise ImportError(f"{{name}} is not installed on a bare GPU machine")
        return None

sys.meta_path.insert(0, Refuse())
"""


def run_bare(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "site"
    stubs.mkdir(exist_ok=True)
    shutil.copy(pynvml.__file__, stubs / "pynvml.py")  # nvidia-ml-py is one module
    code = PRELUDE.format(path=[str(REPO), str(stubs)], forbidden=FORBIDDEN) + body
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


def test_the_check_imports_and_prints_its_help_with_nothing_but_nvidia_ml_py(tmp_path: Path) -> None:
    done = run_bare(
        tmp_path,
        """
from draplugin.gpucheck import check as gpucheck
try:
    gpucheck.main(["--help"])
except SystemExit as exit:
    assert exit.code == 0, exit.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print("REFUSED", refused, "LOADED", loaded)
""",
    )
    assert done.returncode == 0, done.stderr
    assert "usage: gpu-check" in done.stdout and "--driver-root" in done.stdout
    assert "REFUSED [] LOADED []" in done.stdout


def test_the_discovery_comparison_runs_with_nothing_but_nvidia_ml_py(tmp_path: Path) -> None:
    (tmp_path / "smi.xml").write_text(SMI_XML)
    done = run_bare(
        tmp_path,
        """
import json
from pathlib import Path
from draplugin.gpucheck import check as gpucheck
from draplugin.gpucheck.smi import parse_smi_xml
from draplugin.devices.nvml import NvmlBackend
# Python fake: gpu-check's fixtures, whose A10G without MIG support the NVML double has no model of.
from tests.unit.fakenvml import FakeNvml, a10g, h100_with_mig

devices = NvmlBackend("n", nvml=FakeNvml([h100_with_mig(), a10g()])).discover()
rows = gpucheck.compare_discovery(devices, parse_smi_xml(Path("smi.xml").read_text()))
print(json.dumps({"rows": [[r.check, r.status] for r in rows], "refused": refused}))
""",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["refused"] == []
    assert len(result["rows"]) > 5 and {status for _, status in result["rows"]} == {OK}


def test_the_spec_rendering_runs_with_nothing_but_nvidia_ml_py(tmp_path: Path) -> None:
    (tmp_path / "smi.xml").write_text(SMI_XML)
    done = run_bare(
        tmp_path,
        """
import json
from pathlib import Path
from draplugin.gpucheck import check as gpucheck
# Python fake: gpu-check's fixtures, whose A10G without MIG support the NVML double has no model of.
from tests.unit.fakenvml import FakeNvml, a10g, h100_with_mig

rows = gpucheck.check(
    nvml=FakeNvml([h100_with_mig(), a10g()]), smi_xml=Path("smi.xml").read_text(), driver_root=None, runc=None
)
specs = [[r.subject, r.ours] for r in rows if r.check == "CDI spec"]
print(json.dumps({"specs": specs, "refused": refused}))
""",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["refused"] == [] and len(result["specs"]) == 3, result


def test_the_sharing_rows_run_with_nothing_but_nvidia_ml_py(tmp_path: Path) -> None:
    """MPS, time-slice and MIG rows through prepare's modules, without pydantic or PyYAML."""
    (tmp_path / "smi.xml").write_text(SMI_XML)
    done = run_bare(
        tmp_path,
        """
import json
from pathlib import Path
from draplugin.gpucheck import check as gpucheck
from draplugin.cdi.driverlayout import DriverRoot, host_arch
from tests.driverroot_layout import debian_layout
# Python fake: gpu-check's fixtures, whose A10G without MIG support the NVML double has no model of.
from tests.unit.fakenvml import FakeNvml, a10g, h100_with_mig

arch = host_arch()
root = debian_layout(version="580.65.06", lib_dir=f"usr/lib/{arch.multiarch}", machine=arch.machine)
driver = DriverRoot.at(str(root.build(Path("driver").resolve())))
for gi in range(1, 15):  # the nvidia-caps access files of every GPU instance a create can get
    base = Path(f"proc/driver/nvidia/capabilities/gpu0/mig/gi{gi}")
    (base / "ci0").mkdir(parents=True, exist_ok=True)
    (base / "access").write_text(f"DeviceFileMinor: {100 + gi}\\n")
    (base / "ci0" / "access").write_text(f"DeviceFileMinor: {200 + gi}\\n")
nvml = FakeNvml([h100_with_mig(), a10g()])

def listing():
    return "\\n".join(f"(UUID: {m.uuid})" for g in nvml.gpus for m in g.migs if m is not None)

rows = gpucheck.check(nvml=nvml, smi_xml=Path("smi.xml").read_text(), driver_root=driver, runc=None,
                      list_gpus=listing, proc_root=str(Path("proc").resolve()),
                          mps_client=False)
kinds = ("MPS", "time-slice", "MIG create", "MIG destroy")
sharing = [[r.check, r.status] for r in rows if r.check.startswith(kinds)]
print(json.dumps({"sharing": sharing, "refused": sorted(set(refused))}))
""",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    # Not even the CDI spec rendering (planning with default configs) asks for pydantic.
    assert result["refused"] == [], result
    checks = {check for check, _ in result["sharing"]}
    assert {"MPS start", "MPS thread %", "MPS pinned memory", "MPS stop", "time-slice set",
            "time-slice reset", "MIG create", "MIG destroy"} <= checks, result  # fmt: skip
    assert {status for _, status in result["sharing"]} == {OK, SKIPPED}, result
