"""bench.scale.offline's set-up: the project is measured as installed (its bytecode compiled
first, as pip does), and each command as the fastest of as many runs as the floor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale import offline
from bench.scale.runs import Measured, RunError


def test_bytecode_is_written_even_where_python_writes_none(tmp_path: Path) -> None:
    for package in offline.PROJECT_PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "module.py").write_text("VALUE = 1\n")
    # The environment the benchmark runs in may set PYTHONDONTWRITEBYTECODE: imports then
    # write nothing, so every run would compile every module from source.
    code = (
        "import sys; sys.dont_write_bytecode = True\n"
        "from pathlib import Path\n"
        "from bench.scale import offline\n"
        f"offline.compile_bytecode(Path({str(tmp_path)!r}))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=offline.REPO_ROOT)
    for package in offline.PROJECT_PACKAGES:
        assert list((tmp_path / package / "__pycache__").glob("module.*.pyc"))


def test_a_package_that_does_not_compile_fails_the_benchmark(tmp_path: Path) -> None:
    for package in offline.PROJECT_PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "module.py").write_text("def broken(:\n")
    with pytest.raises(RunError, match="bytecode"):
        offline.compile_bytecode(tmp_path)


def _measured(wall_s: float, code: int = 1, out: str = "claim default/unfittable ...") -> Measured:
    return Measured(returncode=code, stdout=out, stderr="", wall_s=wall_s, cpu_s=wall_s, peak_mib=50.0)


def test_explain_is_the_fastest_of_the_floors_count_of_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    walls = iter([0.9, 0.5, 0.7])
    seen: list[list[str]] = []

    def run(command: list[str], timeout_s: float) -> Measured:
        seen.append(command)
        return _measured(next(walls))

    monkeypatch.setattr(offline, "run_timed", run)
    assert offline.explain_unfit([Path("a.yaml")]).wall_s == 0.5
    assert len(seen) == offline.FLOOR_TRIES


def test_each_explain_run_must_answer_not_allocatable(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([_measured(0.5), _measured(0.4, code=2, out="")])
    monkeypatch.setattr(offline, "run_timed", lambda command, timeout_s: next(answers))
    with pytest.raises(RunError, match="exited 2"):
        offline.explain_unfit([Path("a.yaml")])


def test_start_up_is_explains_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def run(command: list[str], timeout_s: float) -> Measured:
        seen.append(command)
        return _measured(0.2, code=0, out="usage: dra-controller explain")

    monkeypatch.setattr(offline, "run_timed", run)
    offline.cli_startup()
    assert seen and all(command[1:] == ["explain", "--help"] for command in seen)
