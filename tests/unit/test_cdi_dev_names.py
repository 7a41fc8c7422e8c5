"""The `.so` names a container gets besides each library's SONAME: what programs built in the
container link against (`-lcuda`, `-lnvidia-ml`, `-lnvcuvid`, `-lnvidia-encode`,
`-lnvidia-opticalflow`), found by NVIDIA's generator as the driver packages' dev links."""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin.cdi.driverfiles import container_edits
from draplugin.cdi.driverlayout import ARCHES, DriverRoot
from draplugin.cdi.driverroot import discover
from tests import nvidia_roots as nr

DEV_NAMES = ("libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow")


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_dev_names_are_mounts_of_the_versioned_file(tmp_path: Path, layout: nr.Layout) -> None:
    try:
        root = nr.build_root(layout, tmp_path / layout, devices=False, ld_cache=False)
    except nr.NvidiaFilesUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    install = discover(DriverRoot.at(str(root.path)), known_version=root.version, arch=ARCHES["x86_64"])
    mounts = {m.container_path: m.host_path for m in container_edits(install).mounts}
    for lib_dir in (f"/usr/lib/{nr.MULTIARCH}", "/usr/lib64"):
        for name in DEV_NAMES:
            assert mounts[f"{lib_dir}/{name}.so"] == str(root.path / root.library(name)), name
    # Only the default capabilities' dev names: graphics is opt-in, and libnvidia-cfg has none.
    assert not any(p.endswith(("/libnvidia-fbc.so", "/libnvidia-cfg.so")) for p in mounts)
