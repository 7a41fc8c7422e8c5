"""What every `dra-controller` command pays before its handler runs: building the parser
imports each subcommand's module, so none of them may import, at module level, what only one
subcommand uses. The figures (issue 34: start-up was 0.26-0.33 s of an explain whose target is
3x a 0.17 s JSON parse) are in docs/scale.md; this checks the imports, not the time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Modules only some subcommands need, each tens of milliseconds of imports (python -X importtime):
# the version lookup (--version, daemons' start log, build_info metrics), the asyncio API client
# and reconciler (`run`), prometheus_client (`run`'s metrics, `top`'s exposition parser),
# urllib.request (`top`'s scrapes).
ONLY_WHEN_USED = (
    "importlib.metadata",
    "asyncio",
    "prometheus_client",
    "controller.run.reconciler",
    "urllib.request",
)


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {ONLY_WHEN_USED!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_building_the_parser_imports_no_single_subcommand_dependency() -> None:
    assert _imported_after("from controller.cli import build_parser; build_parser()") == []


def test_version_is_still_looked_up_when_asked() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "controller.cli", "--version"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    from dracommon.buildinfo import version_line

    assert out.stdout == version_line("dra-controller") + "\n"
    assert out.stderr == ""


# Each subcommand's module, imported only when that subcommand runs (or to list them all).
OTHER_SUBCOMMANDS = (
    "controller.cel.command",
    "controller.simulate.command",
    "controller.lint.command",
    "controller.run.command",
    "controller.top.command",
    "controller.migrate.command",
)


def _modules_after_main(words: list[str], watched: tuple[str, ...] = OTHER_SUBCOMMANDS) -> list[str]:
    probe = (
        "import sys\n"
        "from controller.cli import main\n"
        "try:\n"
        f"    main({words!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('imported:', *(m for m in {watched!r} if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return out.stderr.splitlines()[-1].split()[1:]


def test_a_subcommand_imports_no_other_subcommand() -> None:
    assert _modules_after_main(["explain", "--help"]) == []


def test_offline_explain_imports_no_api_client_nor_build_info() -> None:
    # The API client (~15 ms of imports) is for objects listed from a cluster; the build's
    # version for --version.
    watched = ("dracommon.kubeapi", "dracommon.buildinfo")
    assert _modules_after_main(["explain", "--help"], watched) == []
    assert "dracommon.buildinfo" in _modules_after_main(["--version"], watched)


def test_the_full_list_still_imports_every_subcommand() -> None:
    # --help lists them all, and a word that names none gets argparse's list of choices.
    assert _modules_after_main(["--help"]) == list(OTHER_SUBCOMMANDS)
    assert _modules_after_main(["no-such-command"]) == list(OTHER_SUBCOMMANDS)


def test_every_subcommand_is_registered_by_the_module_named_for_it() -> None:
    from controller.cli import SUBCOMMAND_HOMES

    for name in SUBCOMMAND_HOMES:
        out = subprocess.run(
            [sys.executable, "-m", "controller.cli", name, "--help"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"usage: dra-controller {name} "), name
