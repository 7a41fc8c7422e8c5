"""Which plugin wrote a slice of our pool, and when that means a second node under our name (pure).

Every slice we write carries `WRITER_ANNOTATION`, this machine's writer id
(`draplugin.nodeidentity.writer_id`). A slice of our pool marked with another id
is either a predecessor's (the machine was reinstalled and its state directory
is new) or a live second writer: another machine, or another plugin with its own
state directory, publishing under the same node name. Until our first complete
sync the two cannot be told apart and we take the pool over. After it every
slice of the pool was ours, so another id can only come from a writer that is
running now: a `DuplicateWriter`.

Each such writer would repair the pool to its own devices on every change it
sees, the other repairing it back, without end; so the publisher stops writing
instead (`SlicePublisher`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

WRITER_ANNOTATION: Final = "draplugin.dev/writer"


def writer_of(obj: dict[str, Any]) -> str | None:
    """The writer id a slice is marked with (None: unmarked, e.g. by an older plugin)."""
    value = (obj.get("metadata", {}).get("annotations") or {}).get(WRITER_ANNOTATION)
    return str(value) if value else None


@dataclass(frozen=True, slots=True)
class DuplicateWriter:
    """Another live writer of our pool: `slice_name` was last written by `other`, not by `ours`."""

    node: str
    slice_name: str
    other: str
    ours: str

    def note(self) -> str:
        """The text of the Event and of the reason in the log and health status."""
        return (
            f"ResourceSlice {self.slice_name} of node {self.node} was written by another plugin "
            f"(writer {self.other}) after this one (writer {self.ours}) had published the node's "
            f"pool: two machines, or two plugins with different state directories, use the node "
            f"name {self.node}. This plugin stopped writing ResourceSlices; give each node its "
            "own name, then restart the plugin."
        )


def other_writers(slices: Iterable[dict[str, Any]], ours: str) -> list[tuple[str, str]]:
    """(slice name, writer) of each slice marked by a writer other than `ours`."""
    found = []
    for obj in slices:
        writer = writer_of(obj)
        if writer is not None and writer != ours:
            found.append((str(obj.get("metadata", {}).get("name")), writer))
    return sorted(found)
