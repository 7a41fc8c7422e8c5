"""The wire-contract comparison catches what it must, and the stubs behave as the contract says.

The comparison of our stubs with upstream's protos needs the Go module cache and
lives in tests/integration/test_wire_contract_upstream.py. These tests prove the
comparison itself can fail for the right reason: each mutation of a copy of one
of our descriptors must be reported, naming what changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from draplugin.kubelet._proto.dra.v1 import api_pb2 as dra_v1
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_v1
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from tests.wirecontract import (
    UPSTREAM_FILES,
    UpstreamProtoError,
    compile_protos,
    contract_of,
    differences,
    our_descriptor,
    strip_gogo,
)
from tools.protogen import PROTO_SRC

FileProto = descriptor_pb2.FileDescriptorProto
Mutation = Callable[[FileProto], None]


def message(file: FileProto, name: str) -> descriptor_pb2.DescriptorProto:
    return next(m for m in file.message_type if m.name == name)


def field(file: FileProto, message_name: str, field_name: str) -> descriptor_pb2.FieldDescriptorProto:
    return next(f for f in message(file, message_name).field if f.name == field_name)


def renumber(file: FileProto) -> None:
    field(file, "Device", "share_id").number = 6


def rename(file: FileProto) -> None:
    field(file, "Claim", "uid").name = "claim_uid"


def retype(file: FileProto) -> None:
    field(file, "NodePrepareResourceResponse", "error").type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES


def unrepeat(file: FileProto) -> None:
    field(file, "Device", "cdi_device_ids").label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL


def drop_presence(file: FileProto) -> None:
    field(file, "Device", "share_id").proto3_optional = False


def unmap(file: FileProto) -> None:
    entry = next(n for n in message(file, "NodePrepareResourcesResponse").nested_type)
    entry.options.map_entry = False


def stream_prepare(file: FileProto) -> None:
    file.service[0].method[0].server_streaming = True


def swap_response(file: FileProto) -> None:
    file.service[0].method[0].output_type = f".{file.package}.NodeUnprepareResourcesResponse"


def rename_method(file: FileProto) -> None:
    file.service[0].method[1].name = "NodeUnprepare"


def repackage(file: FileProto) -> None:
    file.package = "k8s.io.kubelet.pkg.apis.dra.v2"


def drop_message(file: FileProto) -> None:
    file.message_type.remove(message(file, "Claim"))


DRA_MUTATIONS: dict[str, tuple[Mutation, str]] = {
    "field number": (renumber, "Device #6: only ours"),
    "field name": (rename, "Claim #2: ours 'claim_uid"),
    "field type": (retype, "TYPE_BYTES"),
    "repeated label": (unrepeat, "Device #4: ours 'cdi_device_ids LABEL_OPTIONAL"),
    "optional presence": (drop_presence, "proto3_optional=False"),
    "map entry": (unmap, "ClaimsEntry: ours 'map_entry=False'"),
    "streaming flag": (stream_prepare, "server_streaming=True"),
    "method types": (swap_response, "NodePrepareResources: ours"),
    "method name": (rename_method, "DRAPlugin/NodeUnprepare: only ours"),
    "package": (repackage, "package: ours 'k8s.io.kubelet.pkg.apis.dra.v2'"),
    "message": (drop_message, "message .k8s.io.kubelet.pkg.apis.dra.v1.Claim: missing from ours"),
}


def test_identical_descriptors_have_no_differences() -> None:
    for module in UPSTREAM_FILES.values():
        contract = contract_of(our_descriptor(module))
        assert differences(contract, dict(contract)) == []


@pytest.mark.parametrize("change", sorted(DRA_MUTATIONS))
def test_a_changed_copy_of_the_dra_descriptor_is_reported(change: str) -> None:
    mutate, expected = DRA_MUTATIONS[change]
    upstream = our_descriptor(dra_v1)
    ours = FileProto()
    ours.CopyFrom(upstream)
    mutate(ours)
    found = differences(contract_of(ours), contract_of(upstream))
    assert found, f"a changed {change} went unnoticed"
    assert any(expected in line for line in found), found


def test_a_changed_enum_value_is_reported() -> None:
    upstream = our_descriptor(health_v1alpha1)
    ours = FileProto()
    ours.CopyFrom(upstream)
    next(v for v in ours.enum_type[0].value if v.name == "UNHEALTHY").number = 3
    assert differences(contract_of(ours), contract_of(upstream)) == [
        "enum value .v1alpha1.HealthStatus.UNHEALTHY: ours '3', upstream '2'"
    ]


def test_every_row_kind_is_in_the_contract() -> None:
    rows = contract_of(our_descriptor(health_v1alpha1))
    assert rows["package"] == "v1alpha1"
    assert rows["method .v1alpha1.DRAResourceHealth/NodeWatchResources"].endswith("server_streaming=True")
    health = rows["field .v1alpha1.DeviceHealth #2"]
    assert health.startswith("health LABEL_OPTIONAL TYPE_ENUM .v1alpha1.HealthStatus")
    assert rows["enum value .v1alpha1.HealthStatus.HEALTHY"] == "1"


# Kubernetes <= 1.34 writes its kubelet protos with gogo options; the upstream compile strips them.
GOGO_HEADER = """\
import "github.com/gogo/protobuf/gogoproto/gogo.proto";

option (gogoproto.goproto_stringer_all) = false;
option (gogoproto.stringer_all) =  true;
option (gogoproto.marshaler_all) = true;
"""


def with_gogo_options(source: str) -> str:
    """Our v1beta1 proto written the way upstream's 1.34 file is: gogo import, file and field options."""
    header_at = source.index("service DRAPlugin")
    source = source[:header_at] + GOGO_HEADER + "\n" + source[header_at:]
    source = source.replace(
        "cdi_device_ids = 4;", 'cdi_device_ids = 4 [(gogoproto.customname) = "CDIDeviceIDs"];'
    )
    return source.replace(
        "uid = 2;", 'uid = 2 [(gogoproto.customname) = "UID", (gogoproto.nullable) = true];'
    )


def test_gogo_options_are_stripped_and_the_rest_compiles_unchanged(tmp_path: Path) -> None:
    rel = "dra/v1beta1/api.proto"
    gogo = with_gogo_options((PROTO_SRC / rel).read_text())
    assert gogo.count("gogoproto") == 7
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(gogo)
    compiled = compile_protos(tmp_path, [rel])[rel]
    assert list(compiled.dependency) == []
    assert differences(contract_of(compiled), contract_of(our_descriptor(dra_v1beta1))) == []


def test_a_gogo_reference_the_stripper_does_not_know_fails_loudly() -> None:
    source = (
        'syntax = "proto3";\n'
        'message M {\n  string a = 1 [deprecated = true, (gogoproto.moretags) = "x"];\n}\n'
    )
    with pytest.raises(UpstreamProtoError, match="gogoproto reference is left"):
        strip_gogo(source, "m.proto")


def test_share_id_is_optional_in_v1_only() -> None:
    device = dra_v1.Device(pool_name="p", device_name="d")
    assert not device.HasField("share_id")
    device.share_id = ""
    # Explicit presence: an empty share ID is still distinguishable from "not shared".
    assert device.HasField("share_id")
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name


def test_v1_and_v1beta1_messages_are_wire_compatible() -> None:
    """The kubelet converts between the versions field by field; a v1beta1 encoding
    must decode as v1 and back with nothing lost except share_id."""
    beta = dra_v1beta1.NodePrepareResourcesResponse()
    entry = beta.claims["uid-1"]
    entry.devices.add(
        request_names=["gpu"], pool_name="node-a", device_name="gpu-0", cdi_device_ids=["a/b=c"]
    )
    entry.error = "boom"
    as_v1 = dra_v1.NodePrepareResourcesResponse.FromString(beta.SerializeToString())
    assert as_v1.claims["uid-1"].devices[0].device_name == "gpu-0"
    assert as_v1.claims["uid-1"].error == "boom"
    assert dra_v1beta1.NodePrepareResourcesResponse.FromString(as_v1.SerializeToString()) == beta


def test_health_v1_and_v1alpha1_differ_only_in_their_package() -> None:
    """The plugin builds one v1 response and re-reads its bytes as v1alpha1 (health.to_v1alpha1):
    that is sound only while the two files declare the same things under different packages."""
    v1 = contract_of(our_descriptor(health_v1))
    alpha = contract_of(our_descriptor(health_v1alpha1))
    renamed = {
        key.replace(".v1alpha1.", ".v1."): value.replace(".v1alpha1.", ".v1.") for key, value in alpha.items()
    }
    assert renamed.pop("package") == "v1alpha1" and v1.pop("package") == "v1"
    assert differences(v1, renamed) == []
    assert "service .v1.DRAResourceHealth" in v1
