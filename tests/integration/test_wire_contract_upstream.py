"""Our generated kubelet stubs speak exactly upstream's wire contract.

Upstream's `api.proto` files are read from the Go module cache (`k8s.io/kubelet`
at the version tests/cluster/go.mod pins, downloaded by tests/cluster/build.sh)
and compiled now; our side is the descriptors compiled into
draplugin/kubelet/_proto. Any difference in package, service, method, message,
field, map entry or enum fails with one line per difference. No module cache:
the test fails and says how to fill it.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2

from tests.wirecontract import (
    UPSTREAM_FILES,
    UpstreamProtoError,
    compile_protos,
    contract_of,
    differences,
    kubelet_module_dir,
    our_descriptor,
)


@pytest.fixture(scope="module")
def upstream() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    try:
        return compile_protos(kubelet_module_dir(), sorted(UPSTREAM_FILES))
    except UpstreamProtoError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.mark.parametrize("path", sorted(UPSTREAM_FILES))
def test_our_stubs_match_upstreams_proto(
    path: str, upstream: dict[str, descriptor_pb2.FileDescriptorProto]
) -> None:
    ours = contract_of(our_descriptor(UPSTREAM_FILES[path]))
    theirs = contract_of(upstream[path])
    assert differences(ours, theirs) == [], f"our stub for {path} differs from upstream's"
    # Guard against an empty comparison: upstream's file declares a service with methods.
    assert any(row.startswith("method ") for row in theirs)
