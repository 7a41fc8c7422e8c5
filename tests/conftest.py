"""Shared pytest configuration: fixtures that start real Kubernetes components, and the check that
a session leaves nothing mounted or running below the directories it created."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import leftovers

pytest_plugins = ["tests.kube.fixtures"]


@pytest.fixture(scope="session", autouse=True)
def nothing_left_mounted_or_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail the session if a mount or a process is left below a directory the tests created.

    The tests' directories are pytest's base temp and every directory made
    with tempfile.mkdtemp in this process (the runtime, kubelet and plugin
    fixtures' short socket-friendly dirs). Autouse and session-scoped in the
    root conftest, so it is set up first and checks after every other
    fixture has stopped what it started. What it finds is removed (killed,
    lazily unmounted) before failing, so one leak does not pile up on the
    machine.
    """
    created: list[Path] = []
    original = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        path: str = original(*args, **kwargs)
        created.append(Path(path))
        return path

    tempfile.mkdtemp = recording_mkdtemp  # type: ignore[assignment]
    try:
        yield
    finally:
        tempfile.mkdtemp = original
    directories = [tmp_path_factory.getbasetemp(), *created]
    left = leftovers.still_in_use(directories)
    if left:
        for directory in directories:
            if directory.exists():
                try:
                    leftovers.kill_processes_under(directory)
                except RuntimeError as err:  # stuck in the kernel: say so with the rest
                    left.append(str(err))
                leftovers.unmount_under(directory)
        pytest.fail("the tests left these behind (now removed):\n  " + "\n  ".join(left), pytrace=False)
