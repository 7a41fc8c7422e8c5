"""KubeSliceApi's cache of slices: a metadata-only list is enough while every slice is one it has seen."""

from __future__ import annotations

import copy
import itertools
from typing import Any, cast

from dracommon.kubeapi import KubeApi
from dracommon.kubeapi.client import JSON_TYPE, METADATA_LIST
from draplugin.slices.api import RESOURCE_PATH, KubeSliceApi

SELECTOR = "spec.driver=gpu.draplugin.dev,spec.nodeName=node-a"


class FakeKube:
    """The few KubeApi calls KubeSliceApi makes, with resourceVersions and metadata-only lists."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(10)
        self.lists: list[str] = []  # the Accept of each list

    def bump(self, name: str, *, uid: str | None = None) -> None:
        """Someone else writes the object (or deletes and re-creates it, with `uid`)."""
        meta = self.objects[name]["metadata"]
        meta["resourceVersion"] = str(next(self._rv))
        if uid is not None:
            meta["uid"] = uid

    def list(self, path: str, *, query: dict[str, str], accept: str = JSON_TYPE) -> tuple[list[Any], str]:
        assert path == RESOURCE_PATH and query == {"fieldSelector": SELECTOR}
        self.lists.append(accept)
        items = [copy.deepcopy(o) for o in self.objects.values()]
        if accept == METADATA_LIST:
            items = [{"metadata": o["metadata"]} for o in items]
        return items, str(next(self._rv))

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid=f"uid-{obj['metadata']['name']}", resourceVersion=str(next(self._rv)))
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def delete(self, path: str, options: dict[str, Any]) -> dict[str, Any]:
        self.objects.pop(path.rsplit("/", 1)[1], None)
        return {}


def slice_body(name: str, value: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"devices": [{"name": "gpu-0", "value": value}]}}


def make() -> tuple[FakeKube, KubeSliceApi]:
    kube = FakeKube()
    return kube, KubeSliceApi(cast(KubeApi, kube))


def test_slices_written_by_us_are_listed_from_metadata_alone() -> None:
    kube, api = make()
    api.create_slice(slice_body("s-0"))
    stored = api.create_slice(slice_body("s-1"))
    api.replace_slice("s-1", {**stored, "spec": slice_body("s-1", "b")["spec"]})
    items, _ = api.list_slices(SELECTOR)
    assert items == list(kube.objects.values())
    assert kube.lists == [METADATA_LIST]
    api.list_slices(SELECTOR)
    assert kube.lists == [METADATA_LIST, METADATA_LIST]


def test_a_slice_changed_or_recreated_by_someone_else_is_read_in_full() -> None:
    kube, api = make()
    api.create_slice(slice_body("s-0"))
    api.create_slice(slice_body("s-1"))
    kube.objects["s-1"]["spec"]["devices"][0]["value"] = "edited"
    kube.bump("s-1")
    items, _ = api.list_slices(SELECTOR)
    assert kube.lists == [METADATA_LIST, JSON_TYPE]
    assert items[1]["spec"]["devices"][0]["value"] == "edited"
    # Seen now: the next list needs metadata only again.
    api.list_slices(SELECTOR)
    assert kube.lists[-1] == METADATA_LIST
    # Deleted and re-created at the same name: a new uid, read in full even if versions coincided.
    kube.objects["s-0"]["spec"]["devices"][0]["value"] = "recreated"
    kube.objects["s-0"]["metadata"]["uid"] = "another"
    items, _ = api.list_slices(SELECTOR)
    assert kube.lists[-1] == JSON_TYPE and items[0]["spec"]["devices"][0]["value"] == "recreated"


def test_a_slice_someone_else_created_is_read_and_a_deleted_one_is_gone() -> None:
    kube, api = make()
    api.create_slice(slice_body("s-0"))
    kube.objects["foreign"] = {
        "metadata": {"name": "foreign", "uid": "f", "resourceVersion": "1"},
        "spec": {},
    }
    items, _ = api.list_slices(SELECTOR)
    assert kube.lists[-1] == JSON_TYPE and [o["metadata"]["name"] for o in items] == ["s-0", "foreign"]
    del kube.objects["s-0"]
    items, _ = api.list_slices(SELECTOR)
    assert kube.lists[-1] == METADATA_LIST and [o["metadata"]["name"] for o in items] == ["foreign"]
    api.delete_slice("foreign", "f", "1")
    assert api.list_slices(SELECTOR)[0] == []
