"""docs/usage.md shows what `dra-controller top` really prints for its example scrape, and that
scrape holds only series the node plugin exports, with their labels."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dracommon import usagenames as names

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "usage.md"
EXAMPLE = REPO_ROOT / "docs" / "usage" / "gpu-node-1.prom"
COMMAND = "dra-controller top --metrics-file docs/usage/gpu-node-1.prom"


def shown_output(command: str) -> str:
    """The lines after `$ command` in the page's console block, up to the block's end."""
    block = re.search(rf"```console\n\$ {re.escape(command)}\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert block, f"docs/usage.md shows no output for {command}"
    return block.group(1)


def test_the_page_shows_what_top_prints_for_the_example_scrape() -> None:
    program, *args = shlex.split(COMMAND)
    run = subprocess.run(
        [str(Path(sys.executable).parent / program), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == shown_output(COMMAND)


def test_the_example_scrape_holds_only_exported_series_with_their_labels() -> None:
    exported = {m.exposed: set(m.labels) for m in names.USAGE_METRICS}
    families = list(text_string_to_metric_families(EXAMPLE.read_text()))
    assert len(families) >= 7
    for family in families:
        for sample in family.samples:
            assert sample.name in exported, sample.name
            assert set(sample.labels) == exported[sample.name], sample
