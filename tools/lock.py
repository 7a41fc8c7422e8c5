"""Refresh `uv.lock` on purpose and write the requirement files exported from it.

`uv.lock` is the one lock of every Python dependency: the runtime ones, the `dev` and
`fallback` extras and the `build` and `lock` groups, each pinned with the sha256 of every
file PyPI serves for that version, resolved once for every platform and every Python that
`requires-python` allows. It is uv's own format: uv is the one well-kept tool that locks a
whole project universally with hashes, checks a lock against `pyproject.toml` without the
network (`uv lock --check --offline`) and installs a venv exactly as locked (`uv sync
--frozen`); pip-tools' files are per platform and it has no check of that kind.

The exports are views of the lock for tools that read pip's requirements format, never
edited by hand; `tests/unit/test_dependency_lock.py` fails when one differs from what
`uv export` gives now:

- `deploy/requirements.txt`: the runtime dependencies, the image's wheels;
- `deploy/build-requirements.txt`: the build group (pip, hatchling), the image's build stage;
- `tools/uv-requirements.txt`: the lock group (uv itself), which `make venv` bootstraps.

Run as `python -m tools.lock` (`make lock`): without arguments it upgrades every package to
the newest version `pyproject.toml` allows; arguments go to `uv lock` instead, for example
`--upgrade-package grpcio` to move one package, or `--locked` to only write the exports.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK_FILE = REPO_ROOT / "uv.lock"
# Each exported file and the `uv export` flags that select its part of the lock.
EXPORTS: dict[str, tuple[str, ...]] = {
    "deploy/requirements.txt": ("--no-dev", "--no-emit-project"),
    "deploy/build-requirements.txt": ("--only-group", "build"),
    "tools/uv-requirements.txt": ("--only-group", "lock"),
}


# One requirement of an export: `name==version ; marker \` (the marker optional; hashes follow).
EXPORTED_PIN = re.compile(r"^([\w.-]+)==([^\s;]+)(?: ; (.+?))? \\$", re.M)


def pyproject() -> dict[str, Any]:
    """The manifest the lock is of."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def locked_versions() -> dict[str, str]:
    """Each locked package's version, by the normalized name uv writes."""
    with LOCK_FILE.open("rb") as file:
        return {package["name"]: package["version"] for package in tomllib.load(file)["package"]}


def exported_pins(target: str) -> list[tuple[str, str, str]]:
    """(name, version, marker or "") of each requirement in one of `EXPORTS`' files."""
    return EXPORTED_PIN.findall((REPO_ROOT / target).read_text())


def uv_binary() -> Path:
    """The venv's uv, the lock group's version: another uv could write another lock format."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        raise SystemExit(f"lock: {uv} is missing: run `make venv` (it bootstraps the locked uv)")
    return uv


def export_text(uv: Path, flags: tuple[str, ...]) -> str:
    """What `uv export` writes for one part of the lock, read from the lock alone (--frozen)."""
    command = [str(uv), "export", "--quiet", "--frozen", "--offline", *flags]
    return subprocess.run(command, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    uv = uv_binary()
    lock_args = argv or ["--upgrade"]
    version = subprocess.run([str(uv), "--version"], check=True, capture_output=True, text=True).stdout
    print(f"lock: uv lock {' '.join(lock_args)} ({version.strip()})", file=sys.stderr)
    subprocess.run([str(uv), "lock", *lock_args], cwd=REPO_ROOT, check=True)
    for target, flags in EXPORTS.items():
        text = export_text(uv, flags)
        (REPO_ROOT / target).write_text(text)
        pins = sum(1 for line in text.splitlines() if "==" in line and not line.startswith("#"))
        print(f"lock: wrote {target} ({pins} pins)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
