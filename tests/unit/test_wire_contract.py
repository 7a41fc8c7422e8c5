"""The generated stubs speak exactly the kubelet's wire contract.

The table below is written from the upstream facts in the DRA reference notes
(service and method paths, message names, field names, numbers, cardinality,
presence, map fields). It is checked against the compiled descriptors, so a
typo or a renumbering in proto/ fails here rather than against a real kubelet.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

from draplugin.kubelet._proto.dra.v1 import api_pb2 as dra_v1
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2 as registration


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    type: str  # scalar type name, message/enum full name, or "map<key,value message>"
    repeated: bool = False
    presence: bool = False  # explicit presence (proto3 `optional`, or a message field)


@dataclass(frozen=True)
class Method:
    path: str
    request: str
    response: str
    server_streaming: bool = False


def dra_messages(pkg: str, *, with_share_id: bool) -> dict[str, list[Field]]:
    device = [
        Field("request_names", 1, "string", repeated=True),
        Field("pool_name", 2, "string"),
        Field("device_name", 3, "string"),
        Field("cdi_device_ids", 4, "string", repeated=True),
    ]
    if with_share_id:
        device.append(Field("share_id", 5, "string", presence=True))
    return {
        "NodePrepareResourcesRequest": [Field("claims", 1, f"{pkg}.Claim", repeated=True)],
        "NodePrepareResourcesResponse": [
            Field("claims", 1, f"map<string,{pkg}.NodePrepareResourceResponse>", repeated=True)
        ],
        "NodePrepareResourceResponse": [
            Field("devices", 1, f"{pkg}.Device", repeated=True),
            Field("error", 2, "string"),
        ],
        "Device": device,
        "NodeUnprepareResourcesRequest": [Field("claims", 1, f"{pkg}.Claim", repeated=True)],
        "NodeUnprepareResourcesResponse": [
            Field("claims", 1, f"map<string,{pkg}.NodeUnprepareResourceResponse>", repeated=True)
        ],
        "NodeUnprepareResourceResponse": [Field("error", 1, "string")],
        "Claim": [Field("namespace", 1, "string"), Field("uid", 2, "string"), Field("name", 3, "string")],
    }


def dra_methods(pkg: str) -> dict[str, Method]:
    return {
        "NodePrepareResources": Method(
            f"/{pkg}.DRAPlugin/NodePrepareResources",
            f"{pkg}.NodePrepareResourcesRequest",
            f"{pkg}.NodePrepareResourcesResponse",
        ),
        "NodeUnprepareResources": Method(
            f"/{pkg}.DRAPlugin/NodeUnprepareResources",
            f"{pkg}.NodeUnprepareResourcesRequest",
            f"{pkg}.NodeUnprepareResourcesResponse",
        ),
    }


V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"


@dataclass(frozen=True)
class Contract:
    module: ModuleType
    package: str
    service: str
    methods: dict[str, Method]
    messages: dict[str, list[Field]]
    enums: dict[str, dict[str, int]]


CONTRACTS = {
    "pluginregistration": Contract(
        module=registration,
        package="pluginregistration",
        service="Registration",
        methods={
            "GetInfo": Method(
                "/pluginregistration.Registration/GetInfo",
                "pluginregistration.InfoRequest",
                "pluginregistration.PluginInfo",
            ),
            "NotifyRegistrationStatus": Method(
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                "pluginregistration.RegistrationStatus",
                "pluginregistration.RegistrationStatusResponse",
            ),
        },
        messages={
            "InfoRequest": [],
            "PluginInfo": [
                Field("type", 1, "string"),
                Field("name", 2, "string"),
                Field("endpoint", 3, "string"),
                Field("supported_versions", 4, "string", repeated=True),
            ],
            "RegistrationStatus": [Field("plugin_registered", 1, "bool"), Field("error", 2, "string")],
            "RegistrationStatusResponse": [],
        },
        enums={},
    ),
    "dra.v1": Contract(
        module=dra_v1,
        package=V1,
        service="DRAPlugin",
        methods=dra_methods(V1),
        messages=dra_messages(V1, with_share_id=True),
        enums={},
    ),
    "dra.v1beta1": Contract(
        module=dra_v1beta1,
        package=V1BETA1,
        service="DRAPlugin",
        methods=dra_methods(V1BETA1),
        messages=dra_messages(V1BETA1, with_share_id=False),
        enums={},
    ),
    "dra_health.v1alpha1": Contract(
        module=health_v1alpha1,
        package="v1alpha1",
        service="DRAResourceHealth",
        methods={
            "NodeWatchResources": Method(
                "/v1alpha1.DRAResourceHealth/NodeWatchResources",
                "v1alpha1.NodeWatchResourcesRequest",
                "v1alpha1.NodeWatchResourcesResponse",
                server_streaming=True,
            )
        },
        messages={
            "NodeWatchResourcesRequest": [],
            "DeviceIdentifier": [Field("pool_name", 1, "string"), Field("device_name", 2, "string")],
            "DeviceHealth": [
                Field("device", 1, "v1alpha1.DeviceIdentifier", presence=True),
                Field("health", 2, "v1alpha1.HealthStatus"),
                Field("last_updated_time", 3, "int64"),
                Field("health_check_timeout_seconds", 4, "int64"),
                Field("message", 5, "string"),
            ],
            "NodeWatchResourcesResponse": [Field("devices", 1, "v1alpha1.DeviceHealth", repeated=True)],
        },
        enums={"HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}},
    ),
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
}


def describe_type(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        msg = field.message_type
        if msg.GetOptions().map_entry:
            key, value = msg.fields_by_name["key"], msg.fields_by_name["value"]
            return f"map<{describe_type(key)},{describe_type(value)}>"
        return str(msg.full_name)
    if field.enum_type is not None:
        return str(field.enum_type.full_name)
    return _SCALARS.get(field.type, f"unexpected type {field.type}")


def actual_fields(message: Descriptor) -> list[Field]:
    return [
        Field(f.name, f.number, describe_type(f), repeated=f.is_repeated, presence=f.has_presence)
        for f in message.fields
    ]


def file_of(contract: Contract) -> FileDescriptor:
    descriptor: FileDescriptor = contract.module.DESCRIPTOR
    return descriptor


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_package_and_service_names_match_upstream(name: str) -> None:
    contract = CONTRACTS[name]
    fd = file_of(contract)
    assert fd.package == contract.package
    assert list(fd.services_by_name) == [contract.service]
    assert fd.services_by_name[contract.service].full_name == f"{contract.package}.{contract.service}"


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_method_paths_and_types_match_upstream(name: str) -> None:
    contract = CONTRACTS[name]
    service = file_of(contract).services_by_name[contract.service]
    actual = {
        m.name: Method(
            f"/{service.full_name}/{m.name}",
            m.input_type.full_name,
            m.output_type.full_name,
            server_streaming=m.server_streaming,
        )
        for m in service.methods
    }
    assert actual == contract.methods
    assert not any(m.client_streaming for m in service.methods)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_messages_and_fields_match_upstream(name: str) -> None:
    contract = CONTRACTS[name]
    fd = file_of(contract)
    assert sorted(fd.message_types_by_name) == sorted(contract.messages)
    for message_name, expected in contract.messages.items():
        assert actual_fields(fd.message_types_by_name[message_name]) == expected, message_name


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_enums_match_upstream(name: str) -> None:
    contract = CONTRACTS[name]
    fd = file_of(contract)
    assert sorted(fd.enum_types_by_name) == sorted(contract.enums)
    for enum_name, expected in contract.enums.items():
        enum: EnumDescriptor = fd.enum_types_by_name[enum_name]
        assert {v.name: v.number for v in enum.values} == expected


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
