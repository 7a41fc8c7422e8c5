"""The committed stubs in draplugin/kubelet/_proto are exactly what protogen makes from proto/."""

from __future__ import annotations

from pathlib import Path

from tools import protogen


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert written, "protogen wrote nothing"
    fresh = tree(tmp_path)
    committed = tree(protogen.STUB_DIR)
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    changed = sorted(name for name in set(fresh) & set(committed) if fresh[name] != committed[name])
    assert (missing, extra, changed) == ([], [], []), "stubs drifted from proto/: run `make proto` and commit"


def test_every_proto_has_python_grpc_and_typing_stubs(tmp_path: Path) -> None:
    written = {str(p) for p in protogen.generate(tmp_path)}
    for rel in protogen.proto_files():
        stem = str(rel.with_suffix(""))
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            assert stem + suffix in written


def test_regeneration_removes_stubs_of_deleted_protos(tmp_path: Path) -> None:
    out = tmp_path / "out"
    orphan = out / "gone" / "v1" / "api_pb2.py"
    orphan.parent.mkdir(parents=True)
    orphan.write_text("# stale\n")
    keep = out / "handwritten.py"
    keep.write_text("# not generated\n")
    protogen.generate(out)
    assert not orphan.exists()
    assert keep.exists(), "protogen must only delete files it generates"
