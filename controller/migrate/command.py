"""`dra-controller migrate -f FILE_OR_DIR`: device-plugin manifests rewritten to claims, offline.

Standard output: the converted manifests (`-o yaml`, the default, or `-o json`
as one `v1 List`), ResourceClaimTemplates before the first object that uses
them; objects migrate leaves alone are written back as they were read, comments
included (converted objects are re-serialized, so their comments go). With
`--diff`, a unified diff of each changed document instead.

Standard error: one line per change and per thing that could not be translated,
each naming the file, document and object. Exit status 2 only when some input
could not be read (a missing file, a document that is not YAML or not an
object: those are left out of the output, everything else is converted), else 0.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from controller.cli import EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.migrate.convert import Converter, MappingError, ResourceMapping, parse_mapping
from controller.migrate.documents import Document, read_documents

OUTPUT_FORMATS = ("yaml", "json")
_NO_WRAP = 1 << 16  # CEL expressions stay on one line


@dataclass
class Outcome:
    """What one run produced, for the writers and the tests."""

    documents: list[tuple[Document, list[dict[str, Any]], bool]] = field(default_factory=list)
    report: list[str] = field(default_factory=list)
    unreadable: int = 0
    converted: int = 0
    templates: int = 0


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", "(no name)")) if isinstance(meta, Mapping) else "(no name)"
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return f"{obj.get('kind', '(no kind)')} {namespace + '/' if namespace else ''}{name}"


def _convert_one(
    converter: Converter, obj: Mapping[str, Any], where: str, outcome: Outcome
) -> tuple[list[dict[str, Any]], bool]:
    result = converter.convert(obj)
    outcome.report.extend(f"{where}: {_name(obj)}: {message}" for message in result.messages)
    if result.changed:
        outcome.converted += 1
    outcome.templates += len(result.objects) - 1  # the templates come before the object itself
    return result.objects, result.changed


def migrate(documents: Sequence[Document], mappings: Mapping[str, ResourceMapping]) -> Outcome:
    converter = Converter(mappings)
    outcome = Outcome()
    for document in documents:
        if document.error is not None:
            outcome.unreadable += 1
            outcome.report.append(
                f"{document.where if document.index else document.source}: {document.error}: left out"
            )
            continue
        data: dict[str, Any] = document.data
        items = data.get("items")
        if str(data.get("kind", "")).endswith("List") and isinstance(items, list):
            converted: list[dict[str, Any]] = []
            changed = False
            for position, item in enumerate(items):
                if not isinstance(item, Mapping):
                    outcome.report.append(f"{document.where} item {position}: not an object: kept as it is")
                    converted.append(item)
                    continue
                objects, item_changed = _convert_one(
                    converter, item, f"{document.where} item {position}", outcome
                )
                converted.extend(objects)
                changed = changed or item_changed
            outcome.documents.append((document, [{**data, "items": converted}], changed))
            continue
        objects, changed = _convert_one(converter, data, document.where, outcome)
        outcome.documents.append((document, objects, changed))
    return outcome


def _yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(dict(o), sort_keys=False, width=_NO_WRAP) for o in objects)


def _document_text(document: Document, objects: Sequence[Mapping[str, Any]], changed: bool) -> str:
    if not changed:
        return document.text.strip("\n") + "\n"  # as read, comments and all
    return _yaml(objects)


def write_yaml(outcome: Outcome, out: TextIO) -> None:
    out.write("---\n".join(_document_text(d, objects, changed) for d, objects, changed in outcome.documents))


def write_json(outcome: Outcome, out: TextIO) -> None:
    items = [o for _, objects, _ in outcome.documents for o in objects]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, out, indent=2)
    out.write("\n")


def write_diff(outcome: Outcome, out: TextIO) -> None:
    for document, objects, changed in outcome.documents:
        if not changed:
            continue
        before = document.text.strip("\n").splitlines(keepends=True)
        after = _yaml(objects).splitlines(keepends=True)
        before = [line if line.endswith("\n") else line + "\n" for line in before]
        out.writelines(
            difflib.unified_diff(
                before, after, f"{document.where} (device plugin)", f"{document.where} (claims)"
            )
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE_OR_DIR",
        help="manifests to convert: a file, a directory (its .yaml/.yml/.json files) or - for standard "
        "input; repeatable",
    )
    parser.add_argument("-R", "--recursive", action="store_true", help="read directories recursively")
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="RESOURCE=CLASS|RESOURCE=profile:PROFILE",
        help="convert this extended resource too (or differently): to devices of a DeviceClass, or to "
        "MIG devices of one profile. Built in: nvidia.com/gpu=gpu.draplugin.dev and "
        "nvidia.com/mig-<profile>=profile:<profile>",
    )
    parser.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="yaml", help="output format")
    parser.add_argument(
        "--diff",
        action="store_true",
        help="print a unified diff of each changed document instead of the manifests",
    )


def run(args: argparse.Namespace) -> int:
    try:
        mappings = {m.resource: m for m in (parse_mapping(text) for text in args.map)}
    except MappingError as err:
        sys.stderr.write(f"error: {err}\n")
        return EXIT_USAGE
    outcome = migrate(list(read_documents(args.filename, recursive=args.recursive)), mappings)
    if args.diff:
        write_diff(outcome, sys.stdout)
    elif args.output == "json":
        write_json(outcome, sys.stdout)
    else:
        write_yaml(outcome, sys.stdout)
    for line in outcome.report:
        sys.stderr.write(f"migrate: {line}\n")
    sys.stderr.write(
        f"migrate: {outcome.converted} object(s) converted, {outcome.templates} ResourceClaimTemplate(s) "
        f"written, {sum(1 for _, _, changed in outcome.documents if not changed)} document(s) unchanged, "
        f"{outcome.unreadable} unreadable\n"
    )
    return EXIT_USAGE if outcome.unreadable else EXIT_OK


register_subcommand(
    Subcommand(
        name="migrate",
        help="rewrite device-plugin manifests (nvidia.com/gpu limits, GPU Feature Discovery node selectors) "
        "into ResourceClaimTemplates and claims, offline",
        add_arguments=add_arguments,
        handler=run,
    )
)
