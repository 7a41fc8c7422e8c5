"""docs/metrics.md is generated from the code and lists every metric the plugin defines."""

from __future__ import annotations

import re
from pathlib import Path

from dracommon import usagenames as names
from draplugin.usage import docs

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_the_code_generates() -> None:
    assert docs.DOC_PATH.read_text(encoding="utf-8") == docs.render(), (
        "docs/metrics.md is stale: run python -m draplugin.usage.docs"
    )


def test_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "metrics.md"
    stale.write_text("# old\n")
    assert docs.main(["--check", "--output", str(stale)]) == 1
    assert docs.main(["--output", str(stale)]) == 0
    assert docs.main(["--check", "--output", str(stale)]) == 0


def test_every_metric_name_in_the_plugins_code_is_documented() -> None:
    page = docs.render()
    defined: set[str] = set()
    for path in (REPO / "draplugin").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        defined |= set(
            re.findall(r"(?:Counter|Gauge|Histogram|Summary)\(\s*\"(draplugin_[a-z0-9_]+)\"", text)
        )
    assert "draplugin_claim_operations" in " ".join(defined)  # the search finds the existing ones
    missing = [n for n in sorted(defined) if f"`{n}`" not in page and f"`{n}_total`" not in page]
    assert not missing, f"metrics missing from docs/metrics.md: {missing}"


def test_the_contracts_names_are_there_with_their_labels() -> None:
    page = docs.render()
    assert "| `draplugin_claim_gpu_utilization_ratio` | gauge | `node`, `device`, `uuid`, `model`, " in page
    assert "`draplugin_usage_sample_errors_total` | counter | `device`, `reason`" in page
    assert "`draplugin_device_ecc_errors_total` | counter | `node`, `device`, `uuid`, `model`, `type`" in page
    for metric in names.USAGE_METRICS:
        assert f"`{metric.exposed}`" in page
