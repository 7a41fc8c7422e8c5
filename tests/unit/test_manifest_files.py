"""Which files a command reads (controller.manifests.collect): each file once, however it is
reached, with one look at each path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.manifests import Source, collect
from controller.objects import ManifestError

SLICE = "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: s\n"


def test_a_file_reached_through_a_link_or_a_second_name_is_read_once(tmp_path: Path) -> None:
    real = tmp_path / "slices.yaml"
    real.write_text(SLICE)
    (tmp_path / "link.yaml").symlink_to(real)
    os.link(real, tmp_path / "hardlink.yaml")  # a second name of the same file
    found = collect([Source(str(real), False), Source(str(tmp_path), False)])
    assert found.files == [real]
    assert sorted(p.name for p in found.repeated) == ["hardlink.yaml", "link.yaml", "slices.yaml"]


def test_a_directory_skips_dangling_links_and_other_suffixes(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SLICE)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "missing.yaml")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text("{}")
    assert [p.name for p in collect([Source(str(tmp_path), False)]).files] == ["a.yaml"]
    assert [p.name for p in collect([Source(str(tmp_path), True)]).files] == ["a.yaml", "b.json"]


def test_a_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such file or directory"):
        collect([Source(str(tmp_path / "missing.yaml"), False)])
