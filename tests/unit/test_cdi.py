"""CDI spec model (names, minimum cdiVersion) and the atomic per-claim store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from draplugin.cdi import spec as cdi
from draplugin.cdi.spec import (
    CdiDevice,
    CdiError,
    ContainerEdits,
    DeviceNode,
    Mount,
    Spec,
    SpecStore,
    atomic_write,
)

DRIVER = "gpu.draplugin.dev"


def spec(name: str = "claim-gpu-0", edits: ContainerEdits | None = None, kind: str = cdi.KIND) -> Spec:
    return Spec(kind=kind, devices=(CdiDevice(name, edits or ContainerEdits(env=("A=1",))),))


@pytest.mark.parametrize(
    ("built", "version"),
    [
        (spec(), "0.3.0"),
        (spec(edits=ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),))), "0.3.0"),
        (spec(edits=ContainerEdits(mounts=(Mount("/h", "/c", ("rbind",)),))), "0.3.0"),
        (spec(edits=ContainerEdits(mounts=(Mount("/h", "/c", type="bind"),))), "0.4.0"),
        (spec(edits=ContainerEdits(device_nodes=(DeviceNode("/dev/x", host_path="/dev/y"),))), "0.5.0"),
        (spec(name="3f2a-gpu-0"), "0.5.0"),
        (spec(kind="gpu.draplugin.dev/gpu.v2"), "0.6.0"),
    ],
)
def test_cdi_version_is_the_lowest_that_covers_the_fields(built: Spec, version: str) -> None:
    assert built.cdi_version == version
    assert json.loads(built.render())["cdiVersion"] == version


def test_render_is_stable_and_omits_empty_fields() -> None:
    doc = json.loads(spec().render())
    assert doc == {
        "cdiVersion": "0.3.0",
        "kind": "gpu.draplugin.dev/gpu",
        "devices": [{"name": "claim-gpu-0", "containerEdits": {"env": ["A=1"]}}],
    }
    assert spec().render() == spec().render()


def test_render_is_compact_json() -> None:
    """One line of JSON with no spaces between tokens: what `json.dumps` makes with the tightest
    separators, which its C encoder writes (an indented document goes through the pure-Python one,
    about three times the time on every prepare)."""
    built = Spec(
        "gpu.draplugin.dev/gpu",
        (CdiDevice("claim-gpu-0", ContainerEdits(env=("A=1", "B=2"), device_nodes=(DeviceNode("/dev/x"),))),),
    )
    raw = built.render()
    assert raw == (json.dumps(json.loads(raw), separators=(",", ":")) + "\n").encode()
    assert raw.count(b"\n") == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            Spec(kind="nokind", devices=(CdiDevice("a", ContainerEdits()),)),
            "kind 'nokind' is not <vendor>/<class>",
        ),
        (Spec(kind=cdi.KIND, devices=()), "a spec needs at least one device"),
        (spec(name="-bad"), "device name '-bad' is not a valid CDI device name"),
        # A final newline, which `$` would let through and the CDI library refuses.
        (spec(name="gpu-0\n"), "device name 'gpu-0\\\\n' is not a valid CDI device name"),
        (spec(edits=ContainerEdits(env=("BAD\n=1",))), "env entry"),
        (
            Spec(kind="nvidia.com/gpu\n", devices=(CdiDevice("a", ContainerEdits()),)),
            "is not <vendor>/<class>",
        ),
        (spec(edits=ContainerEdits(env=("NOEQUALS",))), "env entry 'NOEQUALS' is not NAME=value"),
        (spec(edits=ContainerEdits(device_nodes=(DeviceNode("dev/x"),))), "must be absolute"),
        (
            Spec(kind=cdi.KIND, devices=(CdiDevice("a", ContainerEdits()), CdiDevice("a", ContainerEdits()))),
            "device name 'a' appears twice",
        ),
    ],
)
def test_invalid_specs_are_refused(bad: Spec, message: str) -> None:
    with pytest.raises(CdiError, match=message):
        bad.render()


def test_qualified_name() -> None:
    assert (
        cdi.qualified_name(cdi.claim_device_name("1234-ab", "gpu-0")) == "gpu.draplugin.dev/gpu=1234-ab-gpu-0"
    )


def test_store_writes_atomically_and_skips_identical_content(tmp_path: Path) -> None:
    store = SpecStore(tmp_path / "cdi", DRIVER)
    assert store.write("uid-1", spec()) is True
    path = store.path_for("uid-1")
    assert path.name == "gpu.draplugin.dev-claim_uid-1.json"
    assert json.loads(path.read_text())["kind"] == cdi.KIND
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    inode = path.stat().st_ino
    assert store.write("uid-1", spec()) is False
    assert path.stat().st_ino == inode  # untouched
    assert store.write("uid-1", spec(name="other")) is True
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(os.listdir(tmp_path / "cdi")) == [path.name]  # no temp files left
    assert list(store.claim_uids()) == ["uid-1"]


def test_store_names_files_and_kind_after_the_driver_name(tmp_path: Path) -> None:
    store = SpecStore(tmp_path, "gpu.example.com")
    assert store.kind == "gpu.example.com/gpu"
    assert store.path_for("uid-1").name == "gpu.example.com-claim_uid-1.json"
    store.write("uid-1", spec(kind=store.kind))
    # Another driver's specs in the same directory are not ours.
    assert list(SpecStore(tmp_path, DRIVER).claim_uids()) == []
    assert list(store.claim_uids()) == ["uid-1"]


def test_store_remove_is_idempotent(tmp_path: Path) -> None:
    store = SpecStore(tmp_path, DRIVER)
    store.write("uid-1", spec())
    assert store.remove("uid-1") is True
    assert store.remove("uid-1") is False
    assert store.read("uid-1") is None


def test_store_ignores_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("x")
    (tmp_path / ".gpu.draplugin.dev-claim_u.json.abc.tmp").write_text("x")
    assert list(SpecStore(tmp_path, DRIVER).claim_uids()) == []


def test_failed_write_leaves_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SpecStore(tmp_path, DRIVER)
    store.write("uid-1", spec())
    before = store.path_for("uid-1").read_bytes()

    def boom(fd: int, mode: int) -> None:
        raise OSError("disk full")

    # Fails after the temp file exists and before the rename (spec writes do not fsync).
    monkeypatch.setattr(os, "fchmod", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write("uid-1", spec(name="changed"))
    monkeypatch.undo()
    assert store.path_for("uid-1").read_bytes() == before
    assert os.listdir(tmp_path) == [store.path_for("uid-1").name]


def test_spec_writes_are_atomic_but_not_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint record is what must survive; the spec is rebuilt from it (SpecStore.write)."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    store = SpecStore(tmp_path, DRIVER)
    assert store.write("uid-1", spec())
    assert synced == [] and store.path_for("uid-1").read_bytes() == spec().render()
    atomic_write(tmp_path / "durable.json", b"{}")
    assert len(synced) == 2  # the durable default: the file, then its directory


def test_uid_cannot_escape_the_directory(tmp_path: Path) -> None:
    with pytest.raises(CdiError):
        SpecStore(tmp_path, DRIVER).path_for("../../etc/passwd")
