"""Pods on a real runtime: waiting for them, and reading what their containers got through the API server.

Logs come from `GET .../pods/<name>/log` and commands run with the exec
subresource (the kubernetes client's websocket stream): the same paths as
`kubectl logs` and `kubectl exec`, API server -> kubelet -> containerd.

`wait_running` fails as soon as the runtime gives up on a container (an image
that is not there, a CDI device it cannot inject, a sandbox it cannot
create) instead of waiting out the timeout, and names the CDI specs of the
pod's claims next to the runtime's own message.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.stream import stream

from devcluster.images import REPORT_END
from devcluster.wait import past_deadline
from dracommon.kubeapi import KubeApi

# Container waiting reasons after which the kubelet only retries the same failure.
FATAL_WAITING = {
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerError",
    "CreateContainerConfigError",
    "RunContainerError",
    "CrashLoopBackOff",
}
FATAL_EVENTS = {"FailedCreatePodSandBox"}
POLL_SECONDS = 0.2


class PodError(RuntimeError):
    """A pod did not get where it was expected to; the message says where it is."""


class ContainerFailed(PodError):
    """The runtime could not start a container; the message says why, and which CDI specs were involved."""


def wait_running(
    api: KubeApi, namespace: str, name: str, timeout: float, cdi_root: Path | None = None
) -> dict[str, Any]:
    """The pod once its phase is Running; ContainerFailed at once when the runtime gives up."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    started = time.monotonic()
    pod: dict[str, Any] = {}
    while True:
        over, how_long = past_deadline(started, timeout)  # stretched while the machine is loaded
        if over:
            break
        pod = api.get(path)
        if pod["status"].get("phase") == "Running":
            return pod
        failure = runtime_failure(api, pod)
        if failure:
            raise ContainerFailed(f"pod {namespace}/{name}: {failure}{describe_cdi(pod, cdi_root)}")
        time.sleep(POLL_SECONDS)
    raise PodError(
        f"timed out after {how_long} waiting for pod {namespace}/{name} to be Running; "
        f"status: {json.dumps(pod.get('status'))[:2000]}"
    )


def runtime_failure(api: KubeApi, pod: dict[str, Any]) -> str:
    """Why the runtime cannot start the pod's containers, or '' while it may still."""
    for status in pod["status"].get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return f"container {status['name']}: {waiting['reason']}: {waiting.get('message', '')}"
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode") != 0:
            code, message = terminated.get("exitCode"), terminated.get("message", "")
            return f"container {status['name']} exited {code}: {message}"
    meta = pod["metadata"]
    query = {"fieldSelector": f"involvedObject.kind=Pod,involvedObject.uid={meta['uid']}"}
    for event in api.get(f"/api/v1/namespaces/{meta['namespace']}/events", query)["items"]:
        if event.get("reason") in FATAL_EVENTS:
            return f"{event['reason']}: {event.get('message', '')}"
    return ""


def describe_cdi(pod: dict[str, Any], cdi_root: Path | None) -> str:
    """The node's CDI spec files (one per prepared claim, named by claim UID), with their content."""
    if cdi_root is None:
        return ""
    claims = [s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []]
    specs = sorted(cdi_root.glob("*.json"))
    lines = [f"\nCDI specs in {cdi_root} (the pod's claims: {claims}):"]
    lines += [f"--- {spec}\n{spec.read_text()}" for spec in specs]
    return "\n".join(lines)


def container_log(api: KubeApi, namespace: str, pod: str, container: str) -> str:
    """What the container wrote to stdout/stderr (`kubectl logs -c`)."""
    text: str = k8s.CoreV1Api(api.api_client).read_namespaced_pod_log(pod, namespace, container=container)
    return text


def workload_report(api: KubeApi, namespace: str, pod: str, container: str) -> str | None:
    """The workload image's report (env, /dev, mounts) from the container's log, once complete."""
    log = container_log(api, namespace, pod, container)
    return log if f"\n{REPORT_END}\n" in f"\n{log}" else None


def exec_in(
    api: KubeApi, namespace: str, pod: str, container: str, command: list[str]
) -> tuple[int, str, str]:
    """Run a command in the container (`kubectl exec`): exit status, stdout, stderr."""
    core = k8s.CoreV1Api(api.api_client)
    response = stream(
        core.connect_get_namespaced_pod_exec, pod, namespace, container=container, command=command,
        stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
    )  # fmt: skip
    try:
        response.run_forever(timeout=60)
        out, err = response.read_stdout(), response.read_stderr()
        code = response.returncode
    finally:
        response.close()
    return (code if code is not None else -1), out, err
