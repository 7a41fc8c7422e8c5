"""Bad input about who a node is: an invalid node name, a second writer under one name, an API
server that does not answer.

The duplicate-writer tests run two real `SlicePublisher`s over the in-memory API of
test_slices_publisher (resourceVersions, preconditions and 409s as the API server has them);
the unreachable cases use real sockets and the real urllib3 client.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeapi.credentials import Credentials
from dracommon.kubeapi.rest import RestClient
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.events import DUPLICATE_NODE_NAME
from draplugin.nodeidentity import WRITER_ID_FILE, node_name_problem, writer_id
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.publisher import SlicePublisher, backend_source
from draplugin.slices.reach import error_class
from draplugin.slices.writer import WRITER_ANNOTATION, writer_of
from tests.unit.test_slices_plan import DRIVER, NODE
from tests.unit.test_slices_publisher import MemoryApi

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- the node name -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["node-1", "gpu-7.rack-3.example.com", "a" * 253])
def test_a_dns_subdomain_is_a_node_name(name: str) -> None:
    assert node_name_problem(name) is None


def test_a_name_wrong_only_by_case_gets_the_kubelets_lower_case_form() -> None:
    problem = node_name_problem("GPU-Node-1")
    assert problem is not None and "'gpu-node-1'" in problem and "cannot be the name of a Node" in problem
    underscore = node_name_problem("node_1")
    assert underscore is not None and "lower case" not in underscore
    assert "254 characters" in (node_name_problem("a" * 254) or "")


def test_run_refuses_an_invalid_node_name_before_it_reaches_the_api_server(tmp_path: Path) -> None:
    """The real entry point: exit 2 with the specific message, and not one connection to the API."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    kubelet = tmp_path / "kubelet"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "draplugin.cli", "run", "--node-name", "GPU_Node", "--backend", "fake"),
            *("--kubeconfig", str(kubeconfig), "--kubelet-root-dir", str(kubelet)),
            *("--state-dir", str(tmp_path / "state"), "--cdi-root", str(tmp_path / "cdi")),
        ],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("draplugin run: error: --node-name (NODE_NAME): 'GPU_Node' is not a DNS")
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody connected
    listener.close()
    assert not kubelet.exists() and not (tmp_path / "state").exists()


# --- the writer identity -----------------------------------------------------------------------


def test_the_writer_id_is_kept_in_the_state_dir(tmp_path: Path) -> None:
    first = writer_id(tmp_path / "state")
    assert writer_id(tmp_path / "state") == first
    assert writer_id(tmp_path / "other") != first
    (tmp_path / "state" / WRITER_ID_FILE).write_text("not an id\n")
    replaced = writer_id(tmp_path / "state")
    assert replaced != first and writer_id(tmp_path / "state") == replaced
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [WRITER_ID_FILE]


def _publisher(api: MemoryApi, writer: str, gpus: int, events: list[tuple[str, str]]) -> SlicePublisher:
    backend = FakeBackend(NODE, config_from_flags(gpus, "L4"))
    return SlicePublisher(
        api,
        node_name=NODE,
        driver=DRIVER,
        source=backend_source(backend),
        metrics=SliceMetrics(CollectorRegistry()),
        writer=writer,
        node_event=lambda reason, note: events.append((reason, note)),
    )


def test_a_second_live_writer_stops_the_first_without_a_write_loop() -> None:
    api = MemoryApi()
    events_a: list[tuple[str, str]] = []
    events_b: list[tuple[str, str]] = []
    a = _publisher(api, "aaaaaaaaaaaaaaaa", 4, events_a)
    a.sync()
    assert {writer_of(o) for o in api.objects.values()} == {"aaaaaaaaaaaaaaaa"}
    assert a.state.ready is False  # the loop sets readiness; one sync alone does not

    b = _publisher(api, "bbbbbbbbbbbbbbbb", 2, events_b)
    assert b.sync().writes > 0  # b cannot tell a live writer from a predecessor: it takes over
    taken = {name: obj["metadata"]["resourceVersion"] for name, obj in api.objects.items()}
    assert {writer_of(o) for o in api.objects.values()} == {"bbbbbbbbbbbbbbbb"}

    for _ in range(3):  # a's watch would trigger these
        assert a.sync().writes == 0
    assert a.duplicate is not None and a.duplicate.other == "bbbbbbbbbbbbbbbb"
    assert [reason for reason, _ in events_a] == [DUPLICATE_NODE_NAME]  # posted once
    assert "node name" in events_a[0][1] and "bbbbbbbbbbbbbbbb" in events_a[0][1]
    assert a.state.ready is False and a.state.reason.startswith(DUPLICATE_NODE_NAME)
    assert a.delete_all() == 0
    assert {name: obj["metadata"]["resourceVersion"] for name, obj in api.objects.items()} == taken
    assert b.sync().writes == 0 and events_b == []


def test_a_predecessors_slices_are_taken_over_and_keep_others_annotations() -> None:
    api = MemoryApi()
    old = _publisher(api, "0000000000000000", 4, [])
    old.sync()
    for obj in api.objects.values():
        obj["metadata"]["annotations"]["example.com/note"] = "kept"
    events: list[tuple[str, str]] = []
    new = _publisher(api, "1111111111111111", 4, events)
    assert new.sync().updated == len(api.objects)
    assert new.sync().writes == 0
    for obj in api.objects.values():
        assert obj["metadata"]["annotations"] == {
            WRITER_ANNOTATION: "1111111111111111",
            "example.com/note": "kept",
        }
    assert new.duplicate is None and events == []


def test_the_loop_reports_ready_once_published() -> None:
    api = MemoryApi()
    publisher = _publisher(api, "aaaaaaaaaaaaaaaa", 2, [])
    states: list[tuple[bool, str]] = []
    publisher.add_state_listener(lambda state: states.append((state.ready, state.reason.split(":")[0])))
    api.fail_next = [ApiError(0, "no answer")]
    publisher.start()
    try:
        from devcluster.wait import wait_for

        wait_for("published", lambda: publisher.state.ready or None, timeout=20)
    finally:
        publisher.stop()
    assert states == [(False, "not published yet"), (False, "transport"), (True, "published")]


# --- an API server that does not answer --------------------------------------------------------


def _failure(server: str, timeout_s: float = 2.0) -> ApiError:
    api = KubeApi(RestClient(Credentials(server=server), retries=0), timeout_s=timeout_s)
    with pytest.raises(ApiError) as caught:
        api.get("/version")
    return caught.value


def test_a_closed_port_is_connection_refused() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    assert error_class(_failure(f"https://127.0.0.1:{port}")) == "connection-refused"


def test_a_server_that_is_not_tls_is_a_tls_failure() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_plain_http() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        conn.close()

    threading.Thread(target=answer_plain_http, daemon=True).start()
    try:
        assert error_class(_failure(f"https://127.0.0.1:{listener.getsockname()[1]}")) == "tls"
    finally:
        listener.close()


def test_a_server_that_never_answers_is_a_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    try:
        assert error_class(_failure(f"http://127.0.0.1:{listener.getsockname()[1]}", 0.5)) == "timeout"
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("status", "kind"), [(401, "unauthorized"), (403, "forbidden"), (503, "server-error"), (404, "http-404")]
)
def test_answers_are_classed_by_status(status: int, kind: str) -> None:
    assert error_class(ApiError(status, "x")) == kind
