"""How the `dra-controller` program ends (controller.cli.console_main): explain and simulate
end without the interpreter's teardown of the objects they hold, their whole output and exit
status intact; other commands end as usual, exit handlers run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import fleet

REPO_ROOT = Path(__file__).resolve().parents[2]


def _program(words: list[str]) -> subprocess.CompletedProcess[str]:
    """`dra-controller WORDS`, with an exit handler that says whether the teardown ran."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('teardown ran', file=sys.stderr))\n"
        "from controller.cli import console_main\n"
        f"sys.argv = ['dra-controller', *{words!r}]\n"
        "console_main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


def test_explain_ends_without_teardown_with_all_its_output(tmp_path: Path) -> None:
    fleet.write_fleet(tmp_path, nodes=300, gpus_per_node=2, claims=[fleet.unfittable_claim()])
    done = _program(["explain", "unfittable", "-n", "default", "--every-node", "-o", "json", "--objects",
                     str(tmp_path)])  # fmt: skip
    assert done.returncode == 1, done.stderr  # not allocatable
    assert "teardown ran" not in done.stderr
    assert len(done.stdout) > 100_000  # more than a pipe holds: flushed before the end
    assert done.stdout.rstrip().endswith("}")
    assert done.stdout.count('"node": "gpu-node-') == 300


def test_a_usage_error_keeps_its_status_and_message(tmp_path: Path) -> None:
    done = _program(["explain", "missing", "-n", "default", "--objects", str(tmp_path)])
    assert done.returncode == 2
    assert "ResourceClaim default/missing not found" in done.stderr
    assert "teardown ran" not in done.stderr


def test_other_commands_end_as_usual() -> None:
    done = _program(["lint", "--help"])
    assert done.returncode == 0
    assert "teardown ran" in done.stderr


def test_the_installed_program_is_console_main() -> None:
    import tomllib

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dra-controller"] == "controller.cli:console_main"
