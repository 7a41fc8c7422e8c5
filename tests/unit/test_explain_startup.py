"""What `dra-controller explain` of YAML manifests leaves out of its process (issue 34: explain at
1,000 nodes within 3x the time to parse the same objects as JSON; docs/scale.md): modules it
does not need (PyYAML for the usual manifests, logging, uuid) and the cyclic collector, whose
passes over its trees freed nothing. This checks what is imported and switched, not the time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import fleet

REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_IMPORTED = ("yaml", "logging", "uuid")

PROBE = """
import gc, sys
import controller.explain.command as command
seen = []
handler = command._run
def probe(args, objects):
    seen.append(gc.isenabled())
    return handler(args, objects)
command._run = probe
from controller.cli import main
code = main(sys.argv[1:])
print(code, seen, [m for m in {not_imported!r} if m in sys.modules])
"""


def _explain(tmp_path: Path, *words: str) -> str:
    written = fleet.write_fleet(
        tmp_path, nodes=3, gpus_per_node=2, fmt="yaml", claims=[fleet.unfittable_claim()]
    )
    paths = [str(p) for p in written.paths]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.format(not_imported=NOT_IMPORTED),
            "explain",
            *words,
            "--objects",
            *paths,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_explain_of_yaml_manifests_imports_neither_pyyaml_nor_logging_nor_uuid(tmp_path: Path) -> None:
    # 1: not allocatable (the claim fits nowhere); the collector is off while explain works.
    assert _explain(tmp_path, "unfittable", "-n", "default") == "1 [False] []"


def test_yaml_output_still_imports_pyyaml(tmp_path: Path) -> None:
    assert _explain(tmp_path, "unfittable", "-n", "default", "-o", "yaml") == "1 [False] ['yaml']"
