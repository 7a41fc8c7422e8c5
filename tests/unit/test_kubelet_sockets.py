"""Socket path rules and on-disk socket lifecycle."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from draplugin.kubelet import sockets

DRIVER = "gpu.draplugin.dev"
POD_UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def bind_and_abandon(path: Path) -> None:
    """Leave a socket file behind, as a crashed process would."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_default_paths_follow_the_kubelet_layout() -> None:
    paths = sockets.socket_paths(Path("/var/lib/kubelet"), DRIVER)
    assert paths.registration == Path("/var/lib/kubelet/plugins_registry/gpu.draplugin.dev-reg.sock")
    assert paths.dra == Path("/var/lib/kubelet/plugins/gpu.draplugin.dev/dra.sock")
    assert paths.registry_dir == Path("/var/lib/kubelet/plugins_registry")
    assert paths.plugin_dir == Path("/var/lib/kubelet/plugins/gpu.draplugin.dev")


def test_per_pod_paths_carry_the_pod_uid() -> None:
    paths = sockets.socket_paths(Path("/var/lib/kubelet"), DRIVER, POD_UID)
    assert paths.registration.name == f"{DRIVER}-{POD_UID}-reg.sock"
    assert paths.dra.name == f"dra-{POD_UID}.sock"
    assert paths.dra.parent == Path("/var/lib/kubelet/plugins/gpu.draplugin.dev")


def test_long_roots_fall_back_to_hashed_names_that_fit() -> None:
    # 40 bytes of root: the plain per-pod registration name no longer fits, the short hash does.
    root = Path("/" + "r" * 39)
    plain = root / "plugins_registry" / f"{DRIVER}-{POD_UID}-reg.sock"
    assert len(os.fsencode(plain)) > sockets.MAX_SOCKET_PATH_BYTES
    paths = sockets.socket_paths(root, DRIVER, POD_UID)
    assert sockets.fits(paths.registration) and sockets.fits(paths.dra)
    assert paths.registration.name.startswith(f"{DRIVER}-") and paths.registration.name.endswith("-reg.sock")
    assert POD_UID not in paths.registration.name
    # Different pods still get different sockets after hashing.
    other = sockets.socket_paths(root, DRIVER, POD_UID.replace("0", "1"))
    assert other.registration != paths.registration


def test_long_driver_names_fall_back_to_a_hash_of_driver_and_pod() -> None:
    root = Path("/var/kube")
    driver = "a" * 63  # the longest driver name Kubernetes allows
    paths = sockets.socket_paths(root, driver, POD_UID)
    assert paths.registration.name.startswith("dra-")
    assert driver not in paths.registration.name
    assert sockets.fits(paths.registration) and sockets.fits(paths.dra)
    assert paths.dra.parent == root / "plugins" / driver


def test_paths_that_cannot_fit_are_a_clear_error() -> None:
    with pytest.raises(sockets.SocketPathError, match="limit of 105 \\(AF_UNIX and gRPC\\)"):
        sockets.socket_paths(Path("/" + "x" * 100), DRIVER)


@pytest.mark.parametrize("bad", ["", "..", "a/b"])
def test_names_that_would_escape_the_directory_are_rejected(bad: str) -> None:
    with pytest.raises(sockets.SocketPathError):
        sockets.socket_paths(Path("/var/lib/kubelet"), bad)
    with pytest.raises(sockets.SocketPathError):
        sockets.socket_paths(Path("/var/lib/kubelet"), DRIVER, bad)


def test_ensure_dir_creates_missing_directories_with_mode_0750(tmp_path: Path) -> None:
    existing = tmp_path / "kubelet"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    target = existing / "plugins" / DRIVER
    sockets.ensure_dir(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o750
    # A directory someone else made keeps its permissions.
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755


def test_ensure_dir_rejects_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "plugins").write_text("")
    with pytest.raises(sockets.SocketPathError, match="not a directory"):
        sockets.ensure_dir(tmp_path / "plugins")


def test_stale_socket_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "x.sock"
    bind_and_abandon(path)
    assert sockets.remove_stale_socket(path) is True
    assert not path.exists()
    assert sockets.remove_stale_socket(path) is False


def test_non_socket_at_socket_path_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.sock"
    path.write_text("important")
    with pytest.raises(sockets.SocketPathError, match="not a socket"):
        sockets.remove_stale_socket(path)
    assert path.read_text() == "important"


def test_identity_removes_only_our_own_socket(tmp_path: Path) -> None:
    path = tmp_path / "x.sock"
    bind_and_abandon(path)
    ours = sockets.SocketIdentity.of(path)
    # Another instance takes the path over (its socket is created while ours
    # still exists, so it cannot reuse our inode).
    newer = tmp_path / "y.sock"
    bind_and_abandon(newer)
    newer.replace(path)
    assert ours.remove() is False
    assert path.exists()
    theirs = sockets.SocketIdentity.of(path)
    assert theirs.remove() is True
    assert not path.exists()


async def test_a_path_that_fits_is_one_grpc_can_serve_on() -> None:
    """gRPC refuses unix socket paths over 105 bytes (fewer than AF_UNIX's 107): a per-pod name of
    106 or 107 bytes must fall back to the hashed name, or the plugin cannot start at all."""
    import shutil
    import tempfile

    import grpc

    short = Path(tempfile.mkdtemp(prefix="sk-", dir="/tmp"))  # pytest's tmp_path is too long here
    try:
        name = f"plugins_registry/{DRIVER}-{POD_UID}-reg.sock"
        for total in (106, 107):
            root = short / ("r" * (total - len(os.fsencode(short / name)) - 1))
            assert len(os.fsencode(root / name)) == total
            paths = sockets.socket_paths(root, DRIVER, POD_UID)
            sockets.ensure_dir(paths.registry_dir)
            server = grpc.aio.server()
            try:
                server.add_insecure_port(f"unix://{paths.registration}")  # raises if gRPC refuses it
            finally:
                await server.stop(None)
    finally:
        shutil.rmtree(short, ignore_errors=True)
