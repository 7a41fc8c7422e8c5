"""A client of the kubelet's pod-resources API (`v1.PodResourcesLister`) built from the kubelet's own proto.

Monitoring agents (NVIDIA's DCGM exporter among them) learn which container
holds which device from this API, on the kubelet's socket
`<kubelet-root>/pod-resources/kubelet.sock`. The tests ask it what the real
kubelet says about our claims.

The messages come from upstream's `pkg/apis/podresources/v1/api.proto` in
the Go module cache (`k8s.io/kubelet` at the version tests/cluster/go.mod
pins, the one `tests/wirecontract.py` compiles), compiled at call time with
grpc_tools' protoc into descriptors and turned into message classes: no
generated code of ours stands between the test and the kubelet's wire
format. Answers are returned as proto JSON with the proto's field names
(`dynamic_resources`, `claim_resources`, `pool_name`, ...).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Final

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from tests.wirecontract import compile_protos, kubelet_module_dir

PROTO: Final = "pkg/apis/podresources/v1/api.proto"
SERVICE: Final = "/v1.PodResourcesLister"
SOCKET: Final = Path("pod-resources", "kubelet.sock")
CALL_TIMEOUT_S: Final = 10.0


@cache
def _messages() -> dict[str, type[Message]]:
    (file,) = compile_protos(kubelet_module_dir(), [PROTO]).values()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.{name}"))
        for name in ("ListPodResourcesRequest", "ListPodResourcesResponse", "GetPodResourcesRequest",
                     "GetPodResourcesResponse")
    }  # fmt: skip


def socket_path(kubelet_root_dir: Path) -> Path:
    return kubelet_root_dir / SOCKET


def _call(kubelet_root_dir: Path, method: str, request: Message, answer: type[Message]) -> dict[str, Any]:
    with grpc.insecure_channel(f"unix://{socket_path(kubelet_root_dir)}") as channel:
        stub: Any = channel.unary_unary(
            f"{SERVICE}/{method}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=answer.FromString,
        )
        reply = stub(request, timeout=CALL_TIMEOUT_S)
    return json_format.MessageToDict(reply, preserving_proto_field_name=True)


def list_pods(kubelet_root_dir: Path) -> list[dict[str, Any]]:
    """`List`: every pod's resources, per container."""
    messages = _messages()
    answer = _call(
        kubelet_root_dir, "List", messages["ListPodResourcesRequest"](), messages["ListPodResourcesResponse"]
    )
    return list(answer.get("pod_resources", []))


def get_pod(kubelet_root_dir: Path, namespace: str, name: str) -> dict[str, Any]:
    """`Get`: one pod's resources."""
    messages = _messages()
    # Filled from the proto's JSON names rather than keyword arguments: the class is made at run
    # time from a descriptor, so no stub knows its fields, and ParseDict refuses a name the
    # kubelet's proto lacks as the keywords would.
    request = json_format.ParseDict(
        {"pod_name": name, "pod_namespace": namespace}, messages["GetPodResourcesRequest"]()
    )
    answer = _call(kubelet_root_dir, "Get", request, messages["GetPodResourcesResponse"])
    return dict(answer.get("pod_resources", {}))
