"""uv.lock is the tested set of every Python dependency, and everything that installs one reads it.

The judge is uv itself, the lock's own tool at the version the lock group pins: it checks the
lock against pyproject.toml (`uv lock --check`) and the venv against the lock (`uv sync
--check`), offline and with an empty cache, so neither check can be answered by the network
or by what an earlier run downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools import lock

DEV_SYNC_FLAGS = ("--extra", "dev", "--group", "lock")


def run_uv(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run(
        [str(lock.uv_binary()), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def project_copy(tmp_path: Path) -> Path:
    """pyproject.toml and uv.lock alone: what `uv lock --check` reads."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(lock.REPO_ROOT / name, project / name)
    return project


def test_the_lock_agrees_with_pyproject(tmp_path: Path) -> None:
    checked = run_uv("lock", "--check", "--offline", cwd=lock.REPO_ROOT, cache=tmp_path / "cache")
    assert checked.returncode == 0, f"uv.lock is stale: run `make lock` and commit it\n{checked.stderr}"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ('"h11>=0.16,<1"', '"h11>=0.16,<0.99"'),  # a runtime range moved
        ('"pytest>=9,<10"', '"pytest>=9,<10",\n  "rich>=13"'),  # a dev dependency added
        ('lock = ["uv==0.13.10"]', 'lock = ["uv==0.13.9"]'),  # a group's pin moved
    ],
    ids=["runtime-range", "dev-added", "group-pin"],
)
def test_a_lock_that_pyproject_moved_away_from_is_refused(tmp_path: Path, before: str, after: str) -> None:
    project = project_copy(tmp_path)
    manifest = project / "pyproject.toml"
    text = manifest.read_text()
    assert before in text, f"pyproject.toml no longer has {before}: update this case"
    manifest.write_text(text.replace(before, after))
    checked = run_uv("lock", "--check", "--offline", cwd=project, cache=tmp_path / "cache")
    assert checked.returncode != 0, "uv lock --check accepted a lock that pyproject.toml moved away from"
    # make venv syncs with --locked: the same stale lock stops it before anything is installed.
    synced = run_uv(
        "sync", "--locked", "--offline", "--dry-run", *DEV_SYNC_FLAGS, cwd=project, cache=tmp_path / "cache"
    )
    assert synced.returncode != 0


@pytest.mark.parametrize("target", sorted(lock.EXPORTS))
def test_each_export_is_what_the_lock_gives_now(target: str) -> None:
    committed = (lock.REPO_ROOT / target).read_text()
    fresh = lock.export_text(lock.uv_binary(), lock.EXPORTS[target])
    assert committed == fresh, f"{target} differs from uv.lock's export: run `make lock` and commit"


# `name==version \` followed by one or more `--hash=sha256:...` lines: uv export's shape.
PINNED_WITH_HASHES = re.compile(r"^([\w.-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)", re.M)


def test_every_export_pins_each_package_by_hash() -> None:
    for target in lock.EXPORTS:
        text = (lock.REPO_ROOT / target).read_text()
        requirements = PINNED_WITH_HASHES.findall(text)
        lines = [line for line in text.splitlines() if line and not line[0].isspace() and line[0] != "#"]
        assert requirements and len(requirements) == len(lines), f"{target}: a line without == or hashes"


def test_the_runtime_export_is_the_package_dependencies_and_nothing_of_dev() -> None:
    """The image gets every runtime dependency (and theirs) at the locked version, no test tool."""
    locked = lock.locked_versions()
    exported = {name: version for name, version, _ in lock.exported_pins("deploy/requirements.txt")}
    for requirement in lock.pyproject()["project"]["dependencies"]:
        name = canonicalize_name(Requirement(requirement).name)
        assert exported.get(name) == locked[name], f"{name} missing from the image's set"
    for dev_only in ("pytest", "mypy", "ruff", "types-protobuf", "uv", "hatchling"):
        assert dev_only not in exported


def test_the_venv_the_tests_run_in_is_the_lock(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    flags = ("--check", "--locked", "--offline", *DEV_SYNC_FLAGS)
    checked = run_uv("sync", *flags, cwd=lock.REPO_ROOT, cache=cache)
    assert checked.returncode == 0, f"the venv differs from uv.lock: run `make venv`\n{checked.stderr}"


def test_the_bootstrapped_uv_is_the_locked_uv() -> None:
    version = subprocess.run([str(lock.uv_binary()), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.split()[1] == lock.locked_versions()["uv"]


def test_every_wheel_of_ours_is_built_by_the_locked_hatchling() -> None:
    """The editable install and `uv build` take tool.uv's constraint; the image takes the build group."""
    constraint = lock.pyproject()["tool"]["uv"]["build-constraint-dependencies"]
    assert constraint == [f"hatchling=={lock.locked_versions()['hatchling']}"]
    dockerfile = (lock.REPO_ROOT / "deploy/Dockerfile").read_text()
    assert "--require-hashes -r deploy/build-requirements.txt" in dockerfile
    assert "--require-hashes --no-deps -r deploy/requirements.txt" in dockerfile
