"""Raw JSON requests through a kubernetes ApiClient.

Tests write and read API objects as plain JSON: what goes over the wire is
exactly what the test wrote (typed models reject or drop fields they do not
know), and assertions read the fields by their API names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dracommon.kube import send_raw


class KubeJSON:
    """GET/POST/DELETE API paths as JSON, with the client's server and credentials."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        response = send_raw(
            self.api,
            method,
            path,
            query=query,
            body=dict(body) if body is not None else None,
            timeout=timeout,
        )
        data: bytes = response.read()
        if not 200 <= response.status < 300:
            raise ApiException.from_response(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
        result: dict[str, Any] = json.loads(data) if data else {}
        return result

    def merge_patch_status(self, path: str, patch: Mapping[str, Any]) -> int:
        """A JSON merge patch; returns the HTTP status (callers decide which ones are fine)."""
        response = send_raw(
            self.api, "PATCH", path, body=dict(patch), content_type="application/merge-patch+json"
        )
        response.read()
        return int(response.status)

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def delete(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        return self.request("DELETE", path, timeout=timeout)
