"""Manifests read document by document, each with its original text.

As `kubectl -f`: a file, a directory (its *.yaml, *.yml and *.json files; with
`recursive`, those below it too) or `-` for standard input. A YAML stream is
split at its `---` lines before parsing, so one document that is not YAML
costs only itself, and an object that migrate leaves alone can be written back
exactly as it was read (comments included).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from controller.objects import MANIFEST_SUFFIXES

STDIN = "-"
_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$", re.MULTILINE)


class SourceError(OSError):
    """A named file or directory that cannot be read at all."""


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document (or one JSON file) as read."""

    source: str  # the file, or "<stdin>"
    index: int  # 1-based position in its file
    text: str
    data: Any = None
    error: str | None = None  # why it is not a usable document (not YAML, not an object)

    @property
    def where(self) -> str:
        return f"{self.source}#{self.index}"


def _files(raw: str, recursive: bool) -> list[Path]:
    path = Path(raw)
    if path.is_dir():
        pattern = "**/*" if recursive else "*"
        return sorted(p for p in path.glob(pattern) if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    if path.is_file():
        return [path]
    raise SourceError(f"{raw}: no such file or directory")


def split_documents(source: str, text: str) -> Iterator[Document]:
    """The documents of one YAML stream (or of one JSON text), empty ones left out."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            yield Document(source, 1, text, json.loads(text))
            return
        except json.JSONDecodeError:
            pass  # YAML flow style, parsed below
    starts = [0] + [m.end() + 1 for m in _SEPARATOR.finditer(text)]
    ends = [m.start() for m in _SEPARATOR.finditer(text)] + [len(text)]
    index = 0
    for start, end in zip(starts, ends, strict=True):
        chunk = text[start:end]
        try:
            data = yaml.safe_load(chunk)
        except yaml.YAMLError as err:
            index += 1
            problem = str(err).replace("\n", " ")
            yield Document(source, index, chunk, error=f"not YAML: {problem}")
            continue
        if data is None:
            continue
        index += 1
        if not isinstance(data, dict):
            yield Document(
                source, index, chunk, data, error=f"not a Kubernetes object but a {type(data).__name__}"
            )
            continue
        yield Document(source, index, chunk, data)


def read_documents(
    sources: Iterable[str], *, recursive: bool = False, stdin: TextIO | None = None
) -> Iterator[Document]:
    """Every document of every source, in order; a source that cannot be read is one Document
    with `error` set (index 0), and the other sources are still read."""
    for raw in sources:
        if raw == STDIN:
            yield from split_documents("<stdin>", (stdin or sys.stdin).read())
            continue
        try:
            paths = _files(raw, recursive)
        except SourceError as err:
            yield Document(raw, 0, "", error=str(err).removeprefix(f"{raw}: "))
            continue
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                yield Document(str(path), 0, "", error=f"cannot read: {err}")
                continue
            yield from split_documents(str(path), text)
