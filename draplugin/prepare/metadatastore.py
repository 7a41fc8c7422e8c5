"""Device metadata files on disk: write at prepare, remove at unprepare, clean up at start.

What the files say and where they go is `draplugin.prepare.metadata`'s; this
module only puts them there, through the plugin's one atomic writer
(`statefile.atomic_write`: temp file, rename), so a container never sees half
a document and a kill -9 leaves at most a temp file that start-up sweeps.

Order at prepare: each request's document first, then the CDI spec that
mounts it, so no spec ever points at a missing file. Not fsynced, like the
claim's own CDI spec: both are rebuilt from the claim when missing (the
kubelet prepares every claim again after a reboot, the only way an unsynced
write is lost).

A document or spec left by a claim that no checkpoint record holds (a kill
between these writes and the checkpoint, or an unprepare cut short) is
removed at start (`remove_stale`). Every path is checked to stay below the
metadata directory after symlinks are resolved, so nothing is written or
removed outside it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path

from dracommon.kubenames import dns_label_problem, dns_subdomain_problem
from draplugin import statefile
from draplugin.prepare import metadata as md

log = logging.getLogger(__name__)


class MetadataPathError(OSError):
    """A metadata path that would leave the metadata directory (a symlink in the way)."""


class MetadataStore:
    """The driver's metadata documents below `plugin_dir` and their CDI specs in `cdi_root`."""

    def __init__(self, plugin_dir: Path, cdi_root: Path, driver_name: str, *, enabled: bool = True) -> None:
        self.root = plugin_dir / md.METADATA_DIR_NAME
        self.cdi_root = cdi_root
        self.driver = driver_name
        # Off: prepare writes nothing; unprepare and start-up still remove what an earlier run wrote.
        self.enabled = enabled

    # --- paths ----------------------------------------------------------------------------------------

    def claim_dir(self, namespace: str, name: str) -> Path:
        return self.root / md.claim_dir_name(namespace, name)

    def file_path(self, namespace: str, name: str, request: str) -> Path:
        return self.claim_dir(namespace, name) / request / md.FILE_NAME

    def spec_path(self, uid: str, request: str) -> Path:
        return self.cdi_root / md.cdi_spec_name(self.driver, uid, request)

    def _inside(self, path: Path, top: Path) -> Path:
        """`path`, after checking that resolving symlinks keeps it below `top`."""
        real_top = Path(os.path.realpath(top))
        real = Path(os.path.realpath(path))
        if real != real_top and not real.is_relative_to(real_top):
            raise MetadataPathError(f"{path} resolves to {real}, outside {real_top}")
        return path

    # --- prepare --------------------------------------------------------------------------------------

    def write(self, metadata: md.ClaimMetadata) -> dict[str, str]:
        """Write each request's document, then its CDI spec; unchanged files are left alone. Returns
        base request → the metadata CDI device ID to hand the kubelet. Raises OSError."""
        ids: dict[str, str] = {}
        for request in metadata.requests:
            path = self.file_path(metadata.namespace, metadata.name, request.base)
            self._make_dirs(path.parent)
            self._put(self._inside(path, self.root), md.render_document(self.driver, metadata, request))
            spec = md.render_cdi_spec(self.driver, metadata, request, path)
            self._put(self._inside(self.spec_path(metadata.uid, request.base), self.cdi_root), spec.render())
            ids[request.base] = md.cdi_device_id(self.driver, metadata.uid, request.base)
        return ids

    def _make_dirs(self, directory: Path) -> None:
        # Upstream's MkdirAll(0755); each level checked first, so a symlink planted on the way is
        # refused before anything is created behind it.
        self._inside(directory, self.root)
        directory.mkdir(mode=md.DIR_MODE, parents=True, exist_ok=True)

    @staticmethod
    def _put(path: Path, content: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == content:
                return
        statefile.atomic_write(path, content, md.FILE_MODE, durable=False)

    def restore_specs(self, uid: str, namespace: str, name: str) -> list[Path]:
        """Start-up, for a prepared claim: the CDI specs of its documents that are missing (a cleaned
        /var/run/cdi on the same boot). Documents are never rebuilt here: the kubelet's prepare does."""
        restored = []
        for request_dir, doc in self._documents(namespace, name):
            if doc is None or _uid_of(doc) != uid:
                continue
            pod_claim_name = doc.get("podClaimName")
            metadata = md.ClaimMetadata(
                namespace,
                name,
                uid,
                pod_claim_name if isinstance(pod_claim_name, str) else None,
                (md.RequestMetadata(request_dir.name, ()),),
            )
            spec_path = self.spec_path(uid, request_dir.name)
            if spec_path.exists():
                continue
            spec = md.render_cdi_spec(self.driver, metadata, metadata.requests[0], request_dir / md.FILE_NAME)
            self._put(self._inside(spec_path, self.cdi_root), spec.render())
            restored.append(spec_path)
        return restored

    # --- unprepare ------------------------------------------------------------------------------------

    def remove(self, uid: str, namespace: str, name: str) -> bool:
        """The claim's CDI specs first (no runtime may resolve one after), then its documents. Only
        documents of this UID go: a claim of the same name made since keeps its own. A missing file
        is fine. True if anything was removed. Raises OSError (a read-only disk)."""
        removed = False
        for spec in self._specs_of(uid):
            with contextlib.suppress(FileNotFoundError):
                spec.unlink()
                removed = True
        if dns_label_problem(namespace) or dns_subdomain_problem(name):
            return removed  # a name prepare refuses: no document of it can exist, nowhere to look
        claim_dir = self.claim_dir(namespace, name)
        for request_dir, doc in self._documents(namespace, name):
            if doc is not None and _uid_of(doc) not in (uid, None):
                continue  # a newer claim of the same name
            self._remove_tree(request_dir)
            removed = True
        with contextlib.suppress(FileNotFoundError, OSError):
            claim_dir.rmdir()  # only once empty: another UID's request may still be there
        return removed

    def _specs_of(self, uid: str) -> list[Path]:
        prefix = f"{md.cdi_spec_prefix(self.driver)}{uid}_"
        try:
            names = os.listdir(self.cdi_root)
        except FileNotFoundError:
            return []
        return [self.cdi_root / n for n in sorted(names) if n.startswith(prefix) and n.endswith(".json")]

    def _documents(self, namespace: str, name: str) -> Iterator[tuple[Path, dict[str, object] | None]]:
        """Each request directory of the claim and its first document (None: unreadable)."""
        claim_dir = self.claim_dir(namespace, name)
        try:
            entries = sorted(os.scandir(claim_dir), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield Path(entry.path), _first_document(Path(entry.path) / md.FILE_NAME)

    def _remove_tree(self, path: Path) -> None:
        self._inside(path.parent, self.root)
        with contextlib.suppress(FileNotFoundError):
            if path.is_symlink():
                path.unlink()
            else:
                shutil.rmtree(path)

    # --- start-up -------------------------------------------------------------------------------------

    def remove_stale_temp_files(self, before: float) -> list[Path]:
        """Temp files of interrupted writes: documents (below claim/request) and metadata specs."""
        return statefile.remove_stale_temp_files(
            self.root, before, names={md.FILE_NAME}, depth=2
        ) + statefile.remove_stale_temp_files(
            self.cdi_root, before, prefix=md.cdi_spec_prefix(self.driver), suffix=".json"
        )

    def remove_stale(self, known_uids: Collection[str]) -> list[Path]:
        """Documents and specs of claims no record holds (`known_uids`): leaked by a kill between
        their write and the checkpoint, or by an unprepare cut short. Returns what was removed."""
        removed: list[Path] = []
        prefix = md.cdi_spec_prefix(self.driver)
        try:
            spec_names = sorted(os.listdir(self.cdi_root))
        except FileNotFoundError:
            spec_names = []
        for spec_name in spec_names:
            if not (spec_name.startswith(prefix) and spec_name.endswith(".json")):
                continue
            uid = spec_name[len(prefix) :].rpartition("_")[0]
            if uid not in known_uids:
                with contextlib.suppress(FileNotFoundError):
                    (self.cdi_root / spec_name).unlink()
                    removed.append(self.cdi_root / spec_name)
        try:
            claim_dirs = sorted(os.scandir(self.root), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            claim_dirs = []
        for claim_dir in claim_dirs:
            if not claim_dir.is_dir(follow_symlinks=False):
                continue
            namespace, _, name = claim_dir.name.partition("_")
            for request_dir, doc in self._documents(namespace, name):
                if doc is None or _uid_of(doc) not in known_uids:
                    self._remove_tree(request_dir)
                    removed.append(request_dir)
            with contextlib.suppress(OSError):
                os.rmdir(claim_dir.path)
        return removed


def _first_document(path: Path) -> dict[str, object] | None:
    """The stream's first object, as a dict; None when the file is missing or not ours to read."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
        return None
    try:
        doc, _ = json.JSONDecoder().raw_decode(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    meta = doc.get("metadata")
    return doc if isinstance(meta, dict) else None


def _uid_of(doc: dict[str, object]) -> str | None:
    meta = doc.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return uid if isinstance(uid, str) else None
