"""The NVIDIA driver's tools (`nvidia-smi`, `nvidia-cuda-mps-control`) as this process can run them.

They come from the driver root the CDI specs mount (`draplugin.cdi.driverfiles`),
so the plugin runs the tools of exactly the driver the node has loaded.

`DriverTools.env` is the one place that builds a tool's environment; every
invocation (time-slices, MPS daemons in a process or a Pod, `make gpu-check`)
runs with it. The plugin's image has no NVIDIA library: with a driver root
other than `/` (the chart's `/driver-root`, the GPU Operator's
`/run/nvidia/driver`) `nvidia-smi` finds no NVML (it exits 12, "couldn't find
libnvidia-ml.so library") and the MPS server no libcuda. The tools load those
by name (`dlopen("libnvidia-ml.so.1")`, and libcuda its own helpers, e.g.
`libnvidia-ptxjitcompiler.so.1`), so `LD_LIBRARY_PATH` names a directory
holding links to the driver's libraries and nothing else (`library_view`),
made from what discovery resolved, in any layout (Debian's
`usr/lib/<multiarch>/nvidia/current` too). Not the libraries' own directory:
NVIDIA's DRA driver did that first and moved to preloading NVML (commit
"Set LD_PRELOAD to include libnvidia-ml.so.1"), since on most layouts that
directory is the root's whole `usr/lib/<multiarch>`, whose C library our
image's loader would then pick up. Not `LD_PRELOAD` either: it puts NVML into
every process the tool starts, and covers none of libcuda's own `dlopen`s.
`PATH` leads with the root's binary directories, since the MPS control daemon
starts `nvidia-cuda-mps-server` by name (Debian keeps it in `usr/sbin`).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverInstall, DriverRootError
from draplugin.prepare.errors import PlanError

# The container's own search path after the driver root's: a tool may run `sh` or the like.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def library_view(install: DriverInstall, directory: Path) -> Path:
    """A directory under `directory` with one link per library of `install`, at its SONAME and its
    file name, to the resolved file as this process sees it; the same one while the install is.

    Named by the links it holds, so a driver upgrade gets a new one and a daemon started with
    the old one keeps it; made in a temporary directory and renamed, so no tool sees half of one."""
    links: dict[str, str] = {}
    for library in install.libraries:
        target = str(install.root.local(library.file.real))
        for name in (library.soname, library.file_name):
            links.setdefault(name, target)
    digest = hashlib.sha256(repr(sorted(links.items())).encode()).hexdigest()[:16]
    view = directory / f"{install.version}-{digest}"
    if view.is_dir():
        return view
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".view-", dir=directory))
    try:
        for name, target in links.items():
            (staging / name).symlink_to(target)
        staging.chmod(0o755)
        try:
            staging.rename(view)
        except OSError:
            if not view.is_dir():  # another thread or plugin process made the same one first: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return view


def tool_environment(
    install: DriverInstall, tool: Path, libraries: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for `tool` of `install` (a path as this process sees it), plus `extra`;
    `libraries` is the install's `library_view`.

    Nothing of this process's environment is passed on: the tool sees exactly this (the plugin's
    own LD_* or PYTHON* settings are no business of the driver's)."""
    dirs = [str(tool.parent)]
    # The real files' directories: in Debian's layout `usr/bin/nvidia-smi` links to an absolute
    # /etc/alternatives path, which this process would resolve against its own root, not the
    # driver root's (the MPS control daemon starts the server by name through PATH).
    for binary in install.binaries:
        directory = str(install.root.local(binary.real).parent)
        if directory not in dirs:
            dirs.append(directory)
    env = {"PATH": ":".join([*dirs, SYSTEM_PATH]), "LD_LIBRARY_PATH": str(libraries)}
    env.update(extra or {})
    return env


class DriverTools:
    """The tools of a driver root; `views` is where this process keeps the library views
    (`library_view`): the plugin's state dir, which an MPS daemon Pod mounts too."""

    def __init__(self, files: DriverFiles, views: Path) -> None:
        self._files = files
        self.views = views

    def _install(self, name: str) -> DriverInstall:
        try:
            return self._files.install()
        except DriverRootError as err:
            raise PlanError(err.reason, f"the NVIDIA driver's {name} is needed: {err}") from None

    def path(self, name: str) -> Path:
        """Where this process finds the tool, or PlanError(DriverToolMissing) saying where it looked."""
        install = self._install(name)
        for binary in install.binaries:
            if binary.found.name == name:
                # The file itself, its links resolved inside the root (see tool_environment).
                return install.root.local(binary.real)
        raise PlanError(
            "DriverToolMissing",
            f"{name} is not in the NVIDIA driver root {install.root.host} (looked in its usr/bin, bin, "
            "usr/sbin, sbin)",
        )

    def env(self, name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the tool `name` runs with, here or in a Pod that mounts the driver root
        where this process sees it and `views` at the same path (`tool_environment`)."""
        install = self._install(name)
        try:
            libraries = library_view(install, self.views)
        except OSError as err:
            raise PlanError(
                "DriverToolFailed", f"cannot link the NVIDIA driver's libraries under {self.views}: {err}"
            ) from None
        return tool_environment(install, self.path(name), libraries, extra)

    def run(
        self,
        name: str,
        args: Sequence[str],
        *,
        error: type[PlanError],
        reason: str,
        what: str,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        new_session: bool = False,
    ) -> str:
        """Run the driver root's tool `name` with `args` in its environment (plus `env`): `run_tool`."""
        return run_tool(
            [str(self.path(name)), *args],
            error=error,
            reason=reason,
            what=what,
            timeout_s=timeout_s,
            env=self.env(name, env),
            stdin=stdin,
            new_session=new_session,
        )


def run_tool(
    command: Sequence[str],
    *,
    error: type[PlanError],
    reason: str,
    what: str,
    timeout_s: float,
    env: Mapping[str, str],
    stdin: str | None = None,
    new_session: bool = False,
) -> str:
    """Run one driver tool to completion; its stdout, or `error(reason, ...)` saying what failed.

    `env` is required: a driver tool never runs with this process's own environment (`DriverTools.env`).
    `what` names the step in the message ("starting nvidia-cuda-mps-control -d"); the tool's
    own stderr (else stdout) follows a non-zero exit, since that is what tells an admin why."""
    try:
        done = subprocess.run(
            list(command), input=stdin, env=dict(env), capture_output=True, text=True,
            timeout=timeout_s, start_new_session=new_session, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise error(reason, f"{what} failed: {err}") from None
    if done.returncode != 0:
        raise error(reason, f"{what} exited with {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()
