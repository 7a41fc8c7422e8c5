"""What to publish while an NVIDIA device plugin serves the node: the `--device-plugin-coexistence`
setting (`draplugin.devices.deviceplugin_guard` applies it).

Apart from the guard so that `draplugin.config` checks the setting without importing the guard
and the device model (the kubelet plugin's imports before its sockets open,
`tests/unit/test_plugin_start_imports.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

# k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath: fixed, not under the kubelet's --root-dir.
DEFAULT_DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"

Mode = Literal["refuse", "publish-tainted", "split"]
MODES: Final[tuple[Mode, ...]] = ("refuse", "publish-tainted", "split")


@dataclass(frozen=True, slots=True)
class CoexistencePolicy:
    """What to publish while a device plugin serves the node."""

    mode: Mode = "refuse"
    indexes: frozenset[int] = frozenset()  # split: the GPU indexes left to DRA

    @classmethod
    def parse(cls, text: str) -> CoexistencePolicy:
        """`refuse`, `publish-tainted` or `split:<index>[,<index>...]`; ValueError says what is wrong."""
        raw = text.strip()
        if raw in ("refuse", "publish-tainted"):
            return cls(raw)  # type: ignore[arg-type]
        mode, sep, rest = raw.partition(":")
        if mode != "split":
            raise ValueError(f"{text!r} is not one of refuse, publish-tainted, split:<GPU indexes>")
        if not sep or not rest.strip():
            raise ValueError(f"{text!r}: split needs the GPU indexes DRA gets, e.g. split:0,1")
        indexes: set[int] = set()
        for part in rest.split(","):
            item = part.strip()
            if not item.isdigit():
                raise ValueError(f"{text!r}: {item!r} is not a GPU index (a whole number, 0 or more)")
            indexes.add(int(item))
        return cls("split", frozenset(indexes))

    def __str__(self) -> str:
        if self.mode == "split":
            return "split:" + ",".join(map(str, sorted(self.indexes)))
        return self.mode
