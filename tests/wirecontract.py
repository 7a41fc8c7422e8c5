"""Compare our compiled kubelet stubs with upstream's `api.proto` files, field by field.

The wire contract is everything the kubelet and the plugin must agree on for a
call to decode: package (it is part of every method path), services, methods
with their request/response types and streaming flags, messages, fields (name,
number, type, type name, label, proto3 `optional`, oneof), map entries, enums
and their values. Go code-generation options (`go_package`, gogo's) and
comments are not part of it and are left out.

Both sides are reduced to the same flat table, `contract_of(FileDescriptorProto)`:
one row per declared thing, keyed so that a renamed field shows as a changed
row and a renumbered one as a missing row plus an extra row.

Upstream's files come from the Go module cache that `tests/cluster/build.sh`
fills (`k8s.io/kubelet` at the version tests/cluster/go.mod pins) and are
compiled at test time with grpc_tools' protoc into a temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Final

from google.protobuf import descriptor_pb2

from devcluster.binaries import BUILD_COMMAND, CLUSTER_MODULE
from draplugin.kubelet._proto.deviceplugin.v1beta1 import api_pb2 as deviceplugin_v1beta1
from draplugin.kubelet._proto.dra.v1 import api_pb2 as dra_v1
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_v1
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2 as registration

KUBELET_MODULE: Final = "k8s.io/kubelet"

# Upstream's file (relative to the k8s.io/kubelet module) for each of our generated modules.
# Both health versions are served (v1 for the 1.37+ kubelet, v1alpha1 for older ones), so both are compared.
UPSTREAM_FILES: Final[Mapping[str, ModuleType]] = {
    "pkg/apis/pluginregistration/v1/api.proto": registration,
    "pkg/apis/dra/v1/api.proto": dra_v1,
    "pkg/apis/dra/v1beta1/api.proto": dra_v1beta1,
    "pkg/apis/dra-health/v1/api.proto": health_v1,
    "pkg/apis/dra-health/v1alpha1/api.proto": health_v1alpha1,
    # Not served by us: the end-to-end tests' fake device plugin speaks it (tests/fakedeviceplugin.py).
    "pkg/apis/deviceplugin/v1beta1/api.proto": deviceplugin_v1beta1,
}

Contract = dict[str, str]


class UpstreamProtoError(RuntimeError):
    """Upstream's protos cannot be found or compiled; the message says what to run."""


# --- the comparison -----------------------------------------------------------------------------


def our_descriptor(module: ModuleType) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto our generated `*_pb2` module was built from."""
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def contract_of(file: descriptor_pb2.FileDescriptorProto) -> Contract:
    """Every wire-relevant declaration of `file`, one row each."""
    rows: Contract = {"syntax": file.syntax or "proto2", "package": file.package}
    scope = f".{file.package}" if file.package else ""
    for service in file.service:
        rows[f"service {scope}.{service.name}"] = "declared"
        for method in service.method:
            rows[f"method {scope}.{service.name}/{method.name}"] = (
                f"({method.input_type}) returns ({method.output_type}) "
                f"client_streaming={method.client_streaming} server_streaming={method.server_streaming}"
            )
    _add_types(rows, scope, file.message_type, file.enum_type)
    return rows


def _add_types(
    rows: Contract,
    scope: str,
    messages: Iterable[descriptor_pb2.DescriptorProto],
    enums: Iterable[descriptor_pb2.EnumDescriptorProto],
) -> None:
    """Messages and enums declared in `scope`: a file's top level, or inside a message."""
    for message in messages:
        _add_message(rows, scope, message)
    for enum in enums:
        _add_enum(rows, scope, enum)


def _add_message(rows: Contract, scope: str, message: descriptor_pb2.DescriptorProto) -> None:
    name = f"{scope}.{message.name}"
    # A map field is a repeated field of a nested entry message marked map_entry: both sides must agree.
    rows[f"message {name}"] = f"map_entry={message.options.map_entry}"
    oneofs = [oneof.name for oneof in message.oneof_decl]
    for field in message.field:
        oneof = oneofs[field.oneof_index] if field.HasField("oneof_index") else "-"
        rows[f"field {name} #{field.number}"] = (
            f"{field.name} {descriptor_pb2.FieldDescriptorProto.Label.Name(field.label)} "
            f"{descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)} {field.type_name or '-'} "
            f"proto3_optional={field.proto3_optional} oneof={oneof}"
        )
    _add_types(rows, name, message.nested_type, message.enum_type)


def _add_enum(rows: Contract, scope: str, enum: descriptor_pb2.EnumDescriptorProto) -> None:
    name = f"{scope}.{enum.name}"
    rows[f"enum {name}"] = "declared"
    for value in enum.value:
        rows[f"enum value {name}.{value.name}"] = str(value.number)


def differences(ours: Contract, upstream: Contract) -> list[str]:
    """One line per row that is missing on one side or differs; empty when the contracts match."""
    lines = []
    for key in sorted(ours.keys() | upstream.keys()):
        mine, theirs = ours.get(key), upstream.get(key)
        if mine == theirs:
            continue
        if theirs is None:
            lines.append(f"{key}: only ours has it ({mine})")
        elif mine is None:
            lines.append(f"{key}: missing from ours (upstream: {theirs})")
        else:
            lines.append(f"{key}: ours {mine!r}, upstream {theirs!r}")
    return lines


# --- upstream's files ---------------------------------------------------------------------------


def kubelet_module_dir() -> Path:
    """Where the Go module cache holds `k8s.io/kubelet` at the version tests/cluster/go.mod pins.

    `go list -m` answers from go.mod (so a replace directive's version wins) and
    the local cache only (GOPROXY=off): it reports an empty directory rather
    than downloading when the module is not there.
    """
    go = shutil.which("go")
    how = f"run `{BUILD_COMMAND}` (it downloads the Go modules, k8s.io/kubelet among them)"
    if go is None:
        raise UpstreamProtoError(f"`go` is not on PATH to locate upstream's kubelet protos; {how}")
    # As build.sh runs go, plus no network: a missing module is reported, not fetched.
    env = {**os.environ, "GOWORK": "off", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
    env["GOPROXY"] = "off"
    done = subprocess.run(
        [go, "list", "-m", "-f", "{{.Version}} {{.Dir}}", KUBELET_MODULE],
        cwd=CLUSTER_MODULE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise UpstreamProtoError(f"`go list -m {KUBELET_MODULE}` failed: {done.stderr.strip()}; {how}")
    version, _, directory = done.stdout.strip().partition(" ")
    if not directory or not Path(directory).is_dir():
        raise UpstreamProtoError(f"{KUBELET_MODULE}@{version} is not in the Go module cache; {how}")
    return Path(directory)


# Upstream's kubelet protos up to 1.34 import gogo/protobuf's gogo.proto for Go code-generation
# options (customname, marshaler_all, ...). They change nothing on the wire, so they are stripped
# before compiling rather than stubbed: a stub would have to declare every gogo extension with its
# exact type, and gogo's own module is not a dependency of the Kubernetes build we pin.
_GOGO_IMPORT = re.compile(r'^\s*import\s+"github\.com/gogo/protobuf/gogoproto/gogo\.proto"\s*;[ \t]*\n', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.\w+\)\s*=\s*[^;]*;[ \t]*\n", re.M)
# Field options made only of gogo options, e.g. `[(gogoproto.customname) = "UID"]`.
_GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.\w+\)\s*=\s*[^\]]*\]")


def strip_gogo(source: str, name: str) -> str:
    """`source` without its gogo import and gogo options; fails if any gogo reference is left."""
    stripped = _GOGO_FIELD_OPTIONS.sub("", _GOGO_FILE_OPTION.sub("", _GOGO_IMPORT.sub("", source)))
    if "gogoproto" in stripped:
        raise UpstreamProtoError(f"{name}: a gogoproto reference is left after stripping; extend strip_gogo")
    return stripped


def compile_protos(root: Path, files: list[str]) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Compile `files` (relative to `root`) with grpc_tools' protoc; descriptors keyed by the same paths."""
    from grpc_tools import protoc  # dev dependency, as for tools/protogen.py

    with tempfile.TemporaryDirectory(prefix="upstream-protos-") as scratch:
        include = Path(scratch, "in")
        for rel in files:
            target = include / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(strip_gogo((root / rel).read_text(), rel))
        out = Path(scratch, "set.pb")
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{include}",
                f"-I{Path(protoc.__file__).parent / '_proto'}",
                f"--descriptor_set_out={out}",
                *files,
            ]
        )
        if rc != 0:
            raise UpstreamProtoError(f"protoc failed (status {rc}) on {', '.join(files)}; see its stderr")
        compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return {file.name: file for file in compiled.file}
