"""`make gpu-check`, the driver's tools where the plugin and its workloads really run them.

- `compute-policy (plugin image)`: the driver root's `nvidia-smi
  compute-policy -l`, run as the plugin runs it in its pod: in a runc
  container whose root file system has the C libraries and nothing of NVIDIA
  (the plugin's image has no NVIDIA library), the driver root mounted at
  another path than `/` (the chart's `/driver-root`), the GPU device nodes,
  and exactly `DriverTools.env` (its library view mounted where the plugin
  keeps it). It must print what the admin's `nvidia-smi compute-policy -l`
  prints on the host, with the same exit status.
- `MPS client (other PID namespace)`: the claim's MPS control daemon started
  through `MpsDaemons` as prepare starts it, then a CUDA client (ctypes on the
  driver root's `libcuda.so.1`: `cuInit`, `cuCtxCreate`) under `unshare --pid
  --fork --mount-proc` with the claim's `CUDA_MPS_PIPE_DIRECTORY`, as a
  workload container has it: the daemon's `get_server_list` and
  `get_client_list <server>` must list the client by its host PID.

  NVIDIA's DRA driver runs its MPS daemon with `hostPID: true`
  (`templates/mps-control-daemon.tmpl.yaml`, since kubernetes-sigs/dra-driver-nvidia-gpu
  PR #115: "Without this, the MPS server was not able to find its own PID via /proc/self";
  its daemon runs `chroot /driver-root`, whose `/proc` is the host's), while the
  workload pods it serves get only the pipe directory and the shared `/dev/shm`
  as CDI edits (`cmd/gpu-kubelet-plugin/sharing.go`, `GetCDIContainerEdits`), no
  hostPID: the clients are in PID namespaces of their own by design, and the
  daemon learns a client's PID from the kernel (its control log shows "NEW
  CLIENT <pid>" in the daemon's namespace). hostPID is about the daemon
  and its server, not about the clients; this row shows a client in another PID
  namespace is served, against the real daemon.

Both need root (runc; `unshare --pid`); without it, or without runc or
`unshare`, the row is skipped saying so.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot, DriverRootError
from draplugin.devices.model import Device
from draplugin.gpucheck.container import minimal_rootfs, oci_config, run_bundle
from draplugin.gpucheck.sharing import CLAIM_UID, TOOL_TIMEOUT_S, _error, _ledger, subject_of
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row
from draplugin.prepare import mps, timeslice
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.errors import PlanError
from draplugin.prepare.ledger import SharingLedger
from draplugin.prepare.mps import MpsDaemons, MpsSettings

POLICY_CHECK = "compute-policy (plugin image)"
CLIENT_CHECK = "MPS client (other PID namespace)"
CLIENT_READY_S = 60.0
# The CUDA client: creates a context (through MPS, since CUDA_MPS_PIPE_DIRECTORY names a daemon),
# says so, and holds it until its stdin closes. Prints the failing call and its CUresult otherwise.
CLIENT = r"""
import ctypes, sys
cuda = ctypes.CDLL(sys.argv[1])
device, context = ctypes.c_int(), ctypes.c_void_p()
for name, call in (
    ("cuInit", lambda: cuda.cuInit(0)),
    ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
    ("cuCtxCreate", lambda: cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)),
):
    result = call()
    if result != 0:
        print(f"{name} returned {result}", flush=True)
        sys.exit(1)
print("ready", flush=True)
sys.stdin.read()
cuda.cuCtxDestroy_v2(context)
"""

HostSmi = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _is_root() -> bool:
    return os.geteuid() == 0


def _first_lines(text: str, limit: int = 160) -> str:
    lines = [line.strip(" |") for line in text.strip().splitlines()]
    return " / ".join(line for line in lines if line.strip("=-+ "))[:limit]


def _answer(returncode: int, output: str) -> str:
    return (f"exit {returncode}: " if returncode else "") + (_first_lines(output) or "no output")


# --- compute-policy from the plugin's image --------------------------------------------------------------


def nvidia_device_nodes(dev_root: str = "/dev") -> list[str]:
    """The host's NVIDIA GPU and control nodes (`/dev/nvidia*` character devices), as the plugin's
    privileged pod sees them."""
    found = []
    for path in sorted(Path(dev_root).glob("nvidia*")):
        with contextlib.suppress(OSError):
            if path.is_char_device():
                found.append(str(path))
    return found


def compute_policy_row(
    root: DriverRoot,
    runc: str | None,
    host_smi: HostSmi,
    *,
    is_root: Callable[[], bool] = _is_root,
    dev_root: str = "/dev",
) -> Row:
    """`nvidia-smi compute-policy -l` with the plugin pod's environment against the admin's on the host."""
    subject = "all GPUs"
    if runc is None:
        return Row(POLICY_CHECK, subject, "no runc on PATH", "", SKIPPED)
    if not is_root():
        return Row(POLICY_CHECK, subject, "needs root (runc)", "", SKIPPED)
    try:
        host = host_smi(["compute-policy", "-l"])
        theirs = _answer(host.returncode, host.stdout + host.stderr)
    except (OSError, subprocess.SubprocessError) as err:
        return Row(POLICY_CHECK, subject, "not run", f"host nvidia-smi failed: {err}", MISMATCH)
    with tempfile.TemporaryDirectory(prefix="gpu-check-pod-") as work:
        bundle = Path(work)
        # The pod's view: the driver root at a path of its own (a link here, a mount there), the
        # library view in the plugin's state dir; discovery runs on that view, as the plugin's does.
        pod_root = bundle / "driver-root"
        pod_root.symlink_to(root.mounted.resolve())
        tools = DriverTools(DriverFiles(DriverRoot.at(str(root.host), str(pod_root))), bundle / "driver-libs")
        try:
            smi = tools.path(timeslice.TOOL)
            env = tools.env(timeslice.TOOL)
            nvml = Path(env["LD_LIBRARY_PATH"]) / "libnvidia-ml.so.1"
            for executable in (smi, nvml.resolve()):  # the C libraries the image would have
                minimal_rootfs(bundle / "rootfs", executable)
            mounts = [
                {
                    "containerPath": str(pod_root),
                    "hostPath": str(root.mounted.resolve()),
                    "options": ["rbind", "ro"],
                },
                {"containerPath": str(tools.views), "hostPath": str(tools.views), "options": ["rbind", "ro"]},
            ]
            edits: dict[str, list[Any]] = {
                "env": [f"{k}={v}" for k, v in env.items()],
                "deviceNodes": [{"path": p} for p in nvidia_device_nodes(dev_root)],
                "mounts": mounts,
            }
            config = oci_config(edits, [str(smi), "compute-policy", "-l"])
        except (PlanError, DriverRootError, OSError, ValueError) as err:
            return Row(POLICY_CHECK, subject, f"no bundle: {_error(err)}", theirs, MISMATCH)
        try:
            done = run_bundle(runc, bundle, config)
        except subprocess.TimeoutExpired:
            return Row(POLICY_CHECK, subject, "timed out", theirs, MISMATCH)
    ours = _answer(done.returncode, done.stdout + done.stderr)
    same = done.returncode == host.returncode and done.stdout.strip() == host.stdout.strip()
    return Row(POLICY_CHECK, subject, ours, theirs, OK if same else MISMATCH)


# --- an MPS client in another PID namespace --------------------------------------------------------------


def child_pids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The children of `pid` (`/proc/<pid>/task/<pid>/children`)."""
    try:
        text = (proc / str(pid) / "task" / str(pid) / "children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split() if word.isdigit()]


def pids_of(answer: str) -> list[int]:
    """The PIDs an MPS control answer lists (one per line; `get_server_list`, `get_client_list`)."""
    return [
        int(line.split()[0]) for line in answer.splitlines() if line.strip() and line.split()[0].isdigit()
    ]


def _read_line(stream: object, timeout_s: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
    try:
        if not selector.select(timeout_s):
            return ""
        return str(stream.readline()).strip()  # type: ignore[attr-defined]
    finally:
        selector.close()


def mps_client_rows(gpu: Device, tools: DriverTools, *, is_root: Callable[[], bool] = _is_root) -> list[Row]:
    """The claim's daemon serves a CUDA client in another PID namespace (see the module's words)."""
    subject = subject_of(gpu)
    unshare = shutil.which("unshare")
    if not is_root() or unshare is None:
        why = "needs root (unshare --pid)" if unshare else "no unshare on PATH"
        return [Row(CLIENT_CHECK, subject, why, "", SKIPPED)]
    uid = f"{CLAIM_UID}-pidns"
    daemons = MpsDaemons(tools, shm_bytes=0)  # the daemon and this client share the host's /dev/shm
    rows: list[Row] = []
    with _ledger() as (work, ledger):
        client: subprocess.Popen[str] | None = None
        try:
            daemons.ensure_settings(uid, MpsSettings((gpu.uuid,), None, ()), work / "mps", ledger)
            entry = ledger.get(uid, mps.KIND, mps.KEY)
            assert entry is not None and client is None
            env = tools.env(mps.CONTROL, {"CUDA_MPS_PIPE_DIRECTORY": str(entry.data["pipe"])})
            libcuda = Path(env["LD_LIBRARY_PATH"]) / "libcuda.so.1"  # the driver root's, via its view
            # --kill-child: the client dies with unshare, whatever happens to this check.
            argv = [
                unshare,
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--mount-proc",
                sys.executable,
                "-c",
                CLIENT,
            ]
            client = subprocess.Popen(
                [*argv, str(libcuda)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            said = _read_line(client.stdout, CLIENT_READY_S)
            host_pids = child_pids(client.pid)  # unshare's child: the client, by its host PID
            theirs = f"client PID {host_pids[0]}" if host_pids else "a client PID"
            if said != "ready":
                exited = client.poll()
                stderr = client.stderr.read() if exited is not None and client.stderr else ""
                error = stderr.strip().splitlines()[-1:]
                why = said or (f"exit {exited}: {' '.join(error)}" if exited is not None else "no answer")
                return [*rows, Row(CLIENT_CHECK, subject, f"client: {why}", theirs, MISMATCH)]
            servers = pids_of(daemons.ask(uid, "get_server_list", ledger))
            listed = [p for s in servers for p in pids_of(daemons.ask(uid, f"get_client_list {s}", ledger))]
            ours = f"servers {servers}, clients {listed}"
            ok = bool(host_pids) and host_pids[0] in listed
            rows.append(Row(CLIENT_CHECK, subject, ours, theirs, OK if ok else MISMATCH))
        except (PlanError, OSError, AssertionError) as err:
            rows.append(Row(CLIENT_CHECK, subject, _error(err), "a served client", MISMATCH))
        finally:
            if client is not None:
                _end(client)
            _stop_mps_quietly(daemons, ledger, uid)
    return rows


def _end(client: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError, ValueError):
        assert client.stdin is not None
        client.stdin.close()  # the client destroys its context and exits
    try:
        client.wait(TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        client.kill()  # unshare, and with it (--kill-child) the client
        client.wait()
    for stream in (client.stdout, client.stderr):
        if stream is not None:
            stream.close()


def _stop_mps_quietly(daemons: MpsDaemons, ledger: SharingLedger, uid: str) -> None:
    with contextlib.suppress(PlanError, OSError):
        daemons.stop(uid, ledger)
