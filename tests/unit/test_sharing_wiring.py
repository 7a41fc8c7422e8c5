"""`draplugin run` builds the sharing machinery from its settings: MIG maker, MPS daemons, time-slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from dracommon.kubeapi import KubeApi
from draplugin import config
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.devices import load_backend
from draplugin.devices.fakemig import FakeMigHardware
from draplugin.devices.nvml import NvmlBackend
from draplugin.prepare import wiring
from draplugin.prepare.mps import ProcessRunner
from draplugin.prepare.mpspod import PodRunner
from tests import nvmldouble
from tests.driverroot_layout import debian_layout
from tests.nvmldouble import Gpu


def settings(tmp_path: Path, backend: str = "fake") -> config.Settings:
    return config.load(
        {"node_name": "n", "backend": backend, "state_dir": str(tmp_path / "state")}, environ={}
    )


def test_fake_gpus_get_the_fake_mig_hardware_in_the_state_dir(tmp_path: Path) -> None:
    s = settings(tmp_path)
    backend = load_backend("fake", "n", dev_root="/dev")
    partitioner = wiring._mig_partitioner(s, backend)
    assert isinstance(partitioner, FakeMigHardware)
    assert partitioner.state_file == tmp_path / "state" / "fake-mig.json"
    assert partitioner.device_dir == tmp_path / "state" / "fake-dev"


def test_nvml_makes_its_own_mig_devices(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    double = nvmldouble.nvml_double_factory(tmp_path)("dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    backend: NvmlBackend = nvmldouble.plugin_backend(double, request)
    assert wiring._mig_partitioner(settings(tmp_path, "nvml"), backend) is backend


def test_mps_and_time_slices_need_the_driver_root(tmp_path: Path) -> None:
    s = settings(tmp_path)
    backend = load_backend("fake", "n", dev_root="/dev")
    without = wiring._sharing(s, backend, None, KubeApi(None))
    assert without.mps is None and without.timeslice is None
    root = debian_layout().build(tmp_path / "driver-root")
    with_root = wiring._sharing(s, backend, DriverFiles(DriverRoot.at(str(root))), KubeApi(None))
    assert with_root.mps is not None and with_root.timeslice is not None
    assert with_root.root == tmp_path / "state"
    assert isinstance(with_root.mps.runner, ProcessRunner)  # the default: outside Kubernetes


def test_mps_daemons_run_as_pods_when_the_setting_says_so(tmp_path: Path) -> None:
    s = config.load(
        {"node_name": "n", "backend": "fake", "state_dir": str(tmp_path / "state"), "mps_daemon": "pod",
         "mps_daemon_image": "draplugin:test", "pod_namespace": "dra"},
        environ={},
    )  # fmt: skip
    root = debian_layout().build(tmp_path / "driver-root")
    backend = load_backend("fake", "n", dev_root="/dev")
    sharing = wiring._sharing(s, backend, DriverFiles(DriverRoot.at(str(root))), KubeApi(None))
    assert sharing.mps is not None and isinstance(sharing.mps.runner, PodRunner)


def test_daemon_pods_get_the_charts_pull_secrets_and_the_plugin_pod_as_owner_source(tmp_path: Path) -> None:
    """MPS_DAEMON_IMAGE_PULL_SECRETS (the chart's imagePullSecrets) and POD_UID reach the Pod settings."""
    s = config.load(
        {"node_name": "n", "backend": "fake", "state_dir": str(tmp_path / "state"), "mps_daemon": "pod",
         "mps_daemon_image": "draplugin:test", "pod_namespace": "dra",
         "pod_uid": "3f1d5a6e-0000-4000-8000-000000000001"},
        environ={"MPS_DAEMON_IMAGE_PULL_SECRETS": "regcred, mirror-creds"},
    )  # fmt: skip
    root = debian_layout().build(tmp_path / "driver-root")
    backend = load_backend("fake", "n", dev_root="/dev")
    sharing = wiring._sharing(s, backend, DriverFiles(DriverRoot.at(str(root))), KubeApi(None))
    assert sharing.mps is not None and isinstance(sharing.mps.runner, PodRunner)
    pod_settings = sharing.mps.runner._settings
    assert pod_settings.image_pull_secrets == ("regcred", "mirror-creds")
    assert pod_settings.plugin_pod_uid == "3f1d5a6e-0000-4000-8000-000000000001"
    with pytest.raises(config.ConfigError, match="mps-daemon-image-pull-secrets"):
        config.load(
            {"node_name": "n", "backend": "fake", "state_dir": str(tmp_path / "state")},
            environ={"MPS_DAEMON_IMAGE_PULL_SECRETS": "Bad_Name"},
        )
