"""The fault suite's clean-up part: what a killed `make cluster` / `make demo` run leaves is removed.

A run that dies by SIGKILL leaves, below its state directory, processes (containerd's shims and
containers, reparented to init), mounts (sandboxes' netns, shm, rootfs; kubelet volumes) and the
node's image store. These tests plant exactly such leftovers, with stand-ins that need no
Kubernetes binaries (a `sleep` whose working directory or argument lies there, a tmpfs mounted
there, a large file), and check that the watchdog cleans them when the run is SIGKILLed, that the
next start's prune cleans those of a run whose watchdog died too, that logs stay and that a live
run is never touched. The real cluster stopped twice is tests/e2e/test_cluster_stop.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import leftovers, rundir, wait
from devcluster.wait import wait_for

BIG = 8 * 1024 * 1024


@pytest.fixture
def tmp_base() -> Iterator[Path]:
    """A private stand-in for the temp directory runs live in (other runs on the machine stay unseen)."""
    base = Path(tempfile.mkdtemp(prefix="dra-runs-"))
    try:
        yield base
    finally:
        leftovers.remove_leftovers(base)


def plant(directory: Path) -> list[subprocess.Popen[bytes]]:
    """A run's leftovers below `directory`: two orphan-like processes, a mount, a large file, logs."""
    (directory / "node" / "containerd" / "root").mkdir(parents=True)
    (directory / "node" / "netns").mkdir()
    (directory / "control-plane" / "logs").mkdir(parents=True)
    (directory / "control-plane" / "logs" / "etcd.log").write_text("etcd said things\n")
    (directory / "node" / "containerd" / "root" / "layer.tar").write_bytes(b"\0" * BIG)
    subprocess.run(["mount", "-t", "tmpfs", "leftover", str(directory / "node" / "netns")], check=True)
    socket = directory / "node" / "containerd" / "containerd.sock"
    # Own sessions, like the shims that outlive containerd: not our process group's to signal.
    return [
        subprocess.Popen(["sleep", "3600"], cwd=directory / "node", start_new_session=True),
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)", "-address", str(socket)],
            start_new_session=True,
        ),
    ]


def dead_owner_marker(directory: Path, keep: tuple[str, ...]) -> None:
    """The marker of a run whose process is gone (killed with its watchdog)."""
    owner = subprocess.Popen(["sleep", "3600"])
    ticks = rundir.start_ticks(owner.pid)
    assert ticks is not None
    owner.kill()
    owner.wait()
    rundir.write_marker(directory, rundir.Marker(owner.pid, ticks, keep))


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def assert_clean_but_logs(directory: Path, planted: list[subprocess.Popen[bytes]]) -> None:
    assert leftovers.still_in_use([directory]) == []
    for process in planted:
        assert process.wait(timeout=30) == -signal.SIGKILL
    assert (directory / "control-plane" / "logs" / "etcd.log").read_text() == "etcd said things\n"
    assert not (directory / "node").exists()
    assert size_of(directory) < BIG // 8
    marker = rundir.read_marker(directory)
    assert marker is not None and marker.finished


def test_the_next_start_cleans_what_a_run_killed_with_its_watchdog_left(tmp_base: Path) -> None:
    run = tmp_base / "draplugin-cluster-killed"
    run.mkdir()
    planted = plant(run)
    dead_owner_marker(run, ("control-plane/logs",))
    assert len(leftovers.still_in_use([run])) == 3, leftovers.still_in_use([run])

    assert rundir.prune(tmp_base) == [run]

    assert_clean_but_logs(run, planted)
    assert rundir.prune(tmp_base) == []  # idempotent: nothing left to do


def test_the_watchdog_cleans_up_after_a_sigkilled_run(tmp_base: Path) -> None:
    run = tmp_base / "draplugin-cluster-sigkill"
    run.mkdir()
    planted = plant(run)
    owner_code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from devcluster import rundir
        run = Path({str(run)!r})
        rundir.claim(run, ("control-plane/logs",))
        watchdog = rundir.Watchdog([run])
        print(watchdog.process.pid, flush=True)
        time.sleep(3600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    watchdog_pid = int(owner.stdout.readline())
    os.kill(owner.pid, signal.SIGKILL)  # no clean-up of its own
    owner.wait()

    def finished() -> bool:
        marker = rundir.read_marker(run)
        return marker is not None and marker.finished

    wait_for("the watchdog to clean the run", finished, timeout=120)
    assert_clean_but_logs(run, planted)
    wait_for("the watchdog to exit", lambda: rundir.start_ticks(watchdog_pid) is None, timeout=60)


def test_a_live_run_and_other_directories_are_never_touched(tmp_base: Path) -> None:
    live = tmp_base / "draplugin-cluster-live"
    rundir.claim(live, ("control-plane/logs",))  # this process owns it
    (live / "data").write_bytes(b"x")
    other = tmp_base / "someone-else"
    other.mkdir()
    unmarked = tmp_base / "draplugin-demo-before-markers"
    unmarked.mkdir()
    (unmarked / "data").write_bytes(b"x")

    assert rundir.prune(tmp_base) == []
    assert (live / "data").exists() and other.exists() and (unmarked / "data").exists()
    # `make clean-clusters` removes a run from before markers too, once nothing of it runs.
    assert rundir.prune(tmp_base, everything=True) == [unmarked]
    assert not unmarked.exists() and (live / "data").exists()


def test_clean_clusters_removes_finished_runs_logs_too(tmp_base: Path) -> None:
    run = tmp_base / "draplugin-demo-done"
    run.mkdir()
    planted = plant(run)
    dead_owner_marker(run, ("control-plane/logs",))
    rundir.finish(run)
    assert_clean_but_logs(run, planted)

    assert rundir.prune(tmp_base) == []  # a finished run's logs stay at start
    assert rundir.prune(tmp_base, everything=True) == [run]
    assert not run.exists()


# --- the suite under load: deadlines stretch with the load, within a bound ------------------------


@pytest.mark.parametrize(
    ("load", "cpus", "stretch"), [(0.0, 2, 1.0), (1.0, 2, 1.0), (4.0, 2, 2.0), (50.0, 2, wait.MAX_STRETCH)]
)
def test_a_deadline_stretches_with_the_load_per_cpu_up_to_a_bound(
    load: float, cpus: int, stretch: float
) -> None:
    assert wait.load_stretch(load, cpus) == stretch


def test_a_wait_past_its_timeout_on_a_loaded_machine_is_not_over_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic() - 100  # a 60 s wait begun 100 s ago
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 4.0, 4.0))  # two runnable tasks per CPU
    assert wait.past_deadline(started, 60)[0] is False
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # idle: a real timeout
    over, message = wait.past_deadline(started, 60)
    assert over and "timeout 60s" in message


def test_a_bind_mount_of_the_directory_does_not_make_every_process_a_leftover(tmp_base: Path) -> None:
    """The kubelet bind-mounts its root onto itself: that mount is listed in the mountinfo of every
    process of the namespace, and must not make them the run's."""
    run = tmp_base / "draplugin-cluster-bind"
    (run / "root").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(run / "root"), str(run / "root")], check=True)
    bystander = subprocess.Popen(["sleep", "3600"], cwd="/", start_new_session=True)
    try:
        holders = leftovers.processes_under(run)
        assert bystander.pid not in {h.pid for h in holders}, holders[:3]
        assert holders == []
    finally:
        bystander.kill()
        bystander.wait()


def test_the_watchdog_waits_for_an_owner_whose_pipe_closed_before_it_exited(tmp_base: Path) -> None:
    """A killed process closes its files before it is a zombie: the watchdog sees end of file while
    the owner still looks alive, and must wait for it rather than give up."""
    run = tmp_base / "draplugin-cluster-exiting"
    run.mkdir()
    planted = plant(run)
    owner_code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from devcluster import rundir
        run = Path({str(run)!r})
        rundir.claim(run, ("control-plane/logs",))
        watchdog = rundir.Watchdog([run])
        watchdog.close()  # what exit does first
        os.close(2)  # the watchdog alone holds the test's pipe: it ends when the watchdog does
        sys.stdin.read()  # then "still exiting" until the test kills it
    """)
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert owner.stderr is not None
    said = (
        owner.stderr.readline()
    )  # the watchdog's stderr is the owner's; it exits without a word if it gives up
    assert "waiting for process" in said, said
    owner.kill()
    owner.wait()

    def finished() -> bool:
        marker = rundir.read_marker(run)
        return marker is not None and marker.finished

    wait_for("the watchdog to clean the run", finished, timeout=120)
    assert_clean_but_logs(run, planted)
