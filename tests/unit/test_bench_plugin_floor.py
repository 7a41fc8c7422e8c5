"""The floor `bench.prepare --part rss` sets beside our plugin's RSS when it imports what ours imports:
the module list read from a real `-X importtime` run, and the floor importing that list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.prepare.plugins import modules_imported

REPO_ROOT = Path(__file__).resolve().parents[2]


def _importtime_log(code: str) -> str:
    command = [sys.executable, "-X", "importtime", "-c", code]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stderr


def test_the_modules_are_read_from_a_real_importtime_log_less_the_projects_own() -> None:
    log = _importtime_log("import dracommon.duration, json.tool")
    modules = modules_imported("a plugin log line\n" + log)
    assert {"json", "json.decoder", "json.tool", "argparse"} <= set(modules)
    assert not [m for m in modules if m.split(".")[0] in ("dracommon", "draplugin", "bench")]
    assert "imported package" not in modules  # the header line
    assert len(modules) == len(set(modules))


def test_a_failed_import_tried_twice_is_listed_once() -> None:
    attempt = "try:\n    import no_such_module_here\nexcept ImportError:\n    pass\n"
    log = _importtime_log(attempt * 2)
    assert log.count(" no_such_module_here\n") == 2  # importtime names each failed attempt
    # Listed (which is why the floor passes over a module that fails), once.
    assert modules_imported(log).count("no_such_module_here") == 1


def test_the_floor_imports_each_listed_module_and_passes_over_one_that_does_not_exist(tmp_path: Path) -> None:
    listed = tmp_path / "modules.txt"
    listed.write_text("no_such_module_here\n\nxml.dom.minidom\n")
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bench.plugin_floor import import_listed\n"
        f"import_listed(Path({str(listed)!r}))\n"
        "print('xml.dom.minidom' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"
