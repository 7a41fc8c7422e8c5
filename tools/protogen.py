"""Generate the committed gRPC stubs in `draplugin/kubelet/_proto/` from `proto/`.

A development tool, not part of the wheel: it needs grpcio-tools and
mypy-protobuf (the dev extra) and the `proto/` sources, neither of which an
installed plugin has. Run as `python -m tools.protogen` from the repository
root (or `make proto`). The stubs are committed so the package imports without
a code-generation step; a unit test regenerates them into a temporary directory
and fails when they drift.

protoc derives Python import paths from the include root, so the protos are
first copied into a scratch tree at `draplugin/kubelet/_proto/<dir>/<name>.proto`
and that tree is the `-I` root. Generated code then imports
`draplugin.kubelet._proto.dra.v1.api_pb2` and needs no path tweaks. The wire
names come from each file's `package`, not from where the file lives.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_SRC = REPO_ROOT / "proto"
STUB_DIR = REPO_ROOT / "draplugin" / "kubelet" / "_proto"
# Where the protos sit relative to the include root: this decides the import path.
PACKAGE_PREFIX = Path("draplugin", "kubelet", "_proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
INIT_TEXT = '"""Generated gRPC stubs; edit proto/ and run `make proto` instead."""\n'

log = logging.getLogger(__name__)


class ProtogenError(RuntimeError):
    """protoc or one of its plugins failed, or an input is missing."""


def _plugin_path(name: str) -> str:
    """Find a protoc plugin script: next to the running interpreter first (a venv
    need not be on PATH), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ProtogenError(f"protoc plugin {name!r} not found; install the dev extra (mypy-protobuf)")
    return found


def proto_files(src: Path = PROTO_SRC) -> list[Path]:
    """The .proto files under `src`, relative to it, in a stable order."""
    files = sorted(p.relative_to(src) for p in src.rglob("*.proto"))
    if not files:
        raise ProtogenError(f"no .proto files under {src}")
    return files


def generate(out_dir: Path, src: Path = PROTO_SRC) -> list[Path]:
    """Generate stubs for every proto under `src` into `out_dir` (the `_proto` package dir).

    Returns the written files relative to `out_dir`. Existing generated files
    in `out_dir` are replaced; files for protos that no longer exist are removed.
    """
    from grpc_tools import protoc  # dev-only dependency: imported here, not at module load

    rel_protos = proto_files(src)
    with tempfile.TemporaryDirectory(prefix="protogen-") as scratch:
        include_root = Path(scratch, "in")
        gen_root = Path(scratch, "out")
        gen_root.mkdir()
        for rel in rel_protos:
            target = include_root / PACKAGE_PREFIX / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, target)
        well_known = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{include_root}",
            f"-I{well_known}",
            f"--plugin=protoc-gen-mypy={_plugin_path('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin_path('protoc-gen-mypy_grpc')}",
            f"--python_out={gen_root}",
            f"--grpc_python_out={gen_root}",
            f"--mypy_out={gen_root}",
            f"--mypy_grpc_out={gen_root}",
            *(str(PACKAGE_PREFIX / rel) for rel in rel_protos),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise ProtogenError(f"protoc exited with status {rc}")

        produced = gen_root / PACKAGE_PREFIX
        _remove_generated(out_dir)
        written: list[Path] = []
        for path in sorted(produced.rglob("*")):
            if path.is_file():
                rel = path.relative_to(produced)
                (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, out_dir / rel)
                written.append(rel)
        written.extend(_write_package_inits(out_dir, written))
    return sorted(written)


def _remove_generated(out_dir: Path) -> None:
    """Delete previously generated files so a removed proto leaves nothing behind."""
    if not out_dir.exists():
        return
    for path in out_dir.rglob("*"):
        if not path.is_file():
            continue
        # Only files this tool writes: a mistaken --out must not delete real code.
        ours = path.name.endswith(GENERATED_SUFFIXES) or (
            path.name == "__init__.py" and path.read_text() == INIT_TEXT
        )
        if ours:
            path.unlink()


def _write_package_inits(out_dir: Path, files: list[Path]) -> list[Path]:
    """Every directory on the way to a stub becomes a regular package (mypy needs them)."""
    dirs = {Path()}
    for rel in files:
        dirs.update(rel.parents)
    inits = []
    for rel_dir in sorted(dirs):
        init = rel_dir / "__init__.py"
        (out_dir / init).write_text(INIT_TEXT)
        inits.append(init)
    return inits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=STUB_DIR, help="package directory for the stubs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        written = generate(args.out)
    except ProtogenError as exc:
        log.error("protogen failed: %s", exc)
        return 1
    log.info("wrote %d files to %s", len(written), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
