"""What `draplugin run` imports before the kubelet's sockets open (`cli` parses and validates the
flags, logs its start line with the version, `nodestart` starts `kubelet.server`, `kubelet.metrics`
counts its calls): the API client (urllib3 and its TLS set-up), the node daemon, the prepare path,
the metrics exposition, the device health tracker, the CDI driver layout and importlib.metadata
are needed only behind the sockets, so none of them may be imported before. This checks the
imports, not the time (bench.prepare --part rss times it beside bench/plugin_floor.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

BEFORE_SOCKETS = (
    "import draplugin.cli, draplugin.nodestart, draplugin.kubelet.server, draplugin.kubelet.metrics\n"
    "from dracommon.buildinfo import version\n"
    "version()"  # the start log line's
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
    # The settings check the health policy (devices.healthpolicy), not the tracker and its stream.
    "draplugin.devices.health",
    # The device settings' enums and policies (devices.naming, devices.shared,
    # devices.coexistence) need neither the device model (and its quantities) nor the guard.
    "draplugin.devices.model",
    "draplugin.devices.deviceplugin_guard",
    "dracommon.quantity",
    # The default driver capabilities are checked without the layout module (config).
    "draplugin.cdi.driverlayout",
    # The version is read from the dist-info's METADATA (dracommon.buildinfo); importlib.metadata
    # pulls in email, zipfile and csv.
    "importlib.metadata",
    "email",
    "zipfile",
    # Each a millisecond, used only off the usual path: a socket path too long (kubelet.sockets'
    # hash), the Python version of --version and the build_info metric (dracommon.buildinfo).
    "hashlib",
    "platform",
    # `run` reads a plain command line without argparse's parser (draplugin.cli.run_flags).
    "argparse",
    # The log lines before the sockets need no quoting (dracommon.logs imports json for it).
    "json",
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


def test_the_version_read_from_metadata_is_the_one_importlib_metadata_gives() -> None:
    from importlib import metadata

    from dracommon.buildinfo import DISTRIBUTION, version

    assert version() == metadata.version(DISTRIBUTION)


def test_an_egg_info_first_on_the_path_is_left_to_importlib_metadata(tmp_path: Path) -> None:
    egg = tmp_path / "draplugin.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: draplugin\nVersion: 9.9.9\n")
    code = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "from dracommon.buildinfo import _dist_info_version, version\n"
        "assert _dist_info_version() is None, _dist_info_version()\n"
        "print(version())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "9.9.9"


def test_the_capabilities_spelled_in_the_settings_are_the_layout_defaults() -> None:
    from draplugin import config
    from draplugin.cdi.driverlayout import DEFAULT_CAPABILITIES

    assert config.DEFAULT_CAPABILITY_NAMES == DEFAULT_CAPABILITIES
    assert config.Settings.__dataclass_fields__["driver_capabilities"].default == DEFAULT_CAPABILITIES


def test_the_devices_package_still_gives_the_model_names() -> None:
    code = (
        "import draplugin.devices as devices\n"
        "from draplugin.devices import Device, DeviceTaint, load_backend\n"
        "from draplugin.devices.deviceplugin_guard import DEFAULT_DEVICE_PLUGIN_DIR, CoexistencePolicy\n"
        "from draplugin.devices.health import HealthPolicy, parse_xids\n"
        "assert Device.__module__ == DeviceTaint.__module__ == 'draplugin.devices.model'\n"
        "assert CoexistencePolicy.__module__ == 'draplugin.devices.coexistence'\n"
        "assert HealthPolicy.__module__ == 'draplugin.devices.healthpolicy'\n"
        "try:\n"
        "    devices.NoSuchName\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')"
    )
    assert _imported(code, ("draplugin.devices.model",)) == ["draplugin.devices.model"]


def test_the_dataclasses_before_the_sockets_have_docstrings_of_their_own() -> None:
    """Without one, @dataclass makes a docstring from inspect.signature of the class: for the
    settings' 47 fields a millisecond of the start before the sockets."""
    code = (
        f"{BEFORE_SOCKETS}\n"
        "import dataclasses, sys\n"
        "for name, module in sorted(sys.modules.items()):\n"
        "    if name.split('.')[0] not in ('draplugin', 'dracommon'):\n"
        "        continue\n"
        "    for obj in vars(module).values():\n"
        "        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name:\n"
        "            if (obj.__dict__.get('__doc__') or '').startswith(obj.__name__ + '('):\n"
        "                print(name + '.' + obj.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == []


def test_the_serving_imports_run_without_the_collector_and_leave_it_as_it_was() -> None:
    code = (
        "import gc, sys\n"
        "from draplugin import cli\n"
        "passes = []\n"
        "def seen(phase, info):\n"
        "    if phase == 'start':\n"
        "        passes.append(info)\n"
        "with cli.collector_paused():\n"
        "    gc.callbacks.append(seen)\n"
        "    import asyncio\n"
        "    import draplugin.nodestart\n"
        "    gc.callbacks.remove(seen)  # a pass may come at once when the collector is back\n"
        "assert 'grpc' in sys.modules, 'the serving imports ran before'\n"
        "assert passes == [], passes\n"
        "assert gc.isenabled()\n"
        "gc.disable()\n"
        "with cli.collector_paused():\n"
        "    pass\n"
        "assert not gc.isenabled()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
