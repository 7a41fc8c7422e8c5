"""`dra-controller cel EXPRESSION -f SLICES.yaml`: evaluate a device selector against ResourceSlices.

Reads ResourceSlice objects (YAML or JSON, several documents per file, `kind: List`
accepted), evaluates the selector for every device and reports matches and errors.
`--driver NAME` keeps only slices of that driver (and supplies it to slices that have
none). Exit 0 when every device evaluated, 1 when some device produced a runtime error,
2 for a compile error or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.cel import ENGINES, CompileError, EvaluationError, compile_selector
from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.manifests import Source, collect
from controller.objects import ManifestError, flatten_document
from controller.options import add_version_argument
from dracommon.kubeversion import KubernetesVersion


class InputError(ValueError):
    """A slices file cannot be read or does not hold ResourceSlices."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    driver: str
    pool: str
    device: Mapping[str, Any]

    @property
    def label(self) -> str:
        return f"{self.pool}/{self.device.get('name', '<unnamed>')}"


@dataclass(slots=True)
class Report:
    matches: list[str] = field(default_factory=list)
    non_matches: list[str] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    order: list[tuple[str, str]] = field(default_factory=list)


def load_objects(path: Path) -> Iterator[Mapping[str, Any]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        documents = list(yaml.safe_load_all(text))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML or JSON: {err}") from None
    try:
        for document in documents:
            yield from flatten_document(document, path)
    except ManifestError as err:
        raise InputError(str(err)) from None


def slice_devices(
    objects: Iterator[Mapping[str, Any]], driver: str | None, source: Path
) -> Iterator[SliceDevice]:
    for obj in objects:
        if obj.get("kind", "ResourceSlice") != "ResourceSlice":
            raise InputError(f"{source}: expected kind ResourceSlice, found {obj.get('kind')!r}")
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise InputError(f"{source}: ResourceSlice without spec")
        slice_driver = spec.get("driver") or driver
        if not isinstance(slice_driver, str) or not slice_driver:
            raise InputError(f"{source}: ResourceSlice without spec.driver (use --driver)")
        if driver is not None and slice_driver != driver:
            continue
        pool = spec.get("pool")
        pool_name = pool.get("name") if isinstance(pool, Mapping) else None
        if not isinstance(pool_name, str) or not pool_name:
            raise InputError(f"{source}: ResourceSlice without spec.pool.name")
        devices = spec.get("devices") or []
        if not isinstance(devices, list):
            raise InputError(f"{source}: spec.devices must be a list")
        for device in devices:
            if not isinstance(device, Mapping):
                raise InputError(f"{source}: device entry is not an object")
            yield SliceDevice(slice_driver, pool_name, device)


def evaluate(
    expression: str,
    paths: list[Path],
    driver: str | None,
    engine: str | None,
    kubernetes_version: KubernetesVersion | None = None,
) -> Report:
    selector = compile_selector(expression, engine=engine, kubernetes_version=kubernetes_version)
    report = Report()
    for path in paths:
        for item in slice_devices(load_objects(path), driver, path):
            try:
                if selector.matches(item.driver, item.device):
                    report.matches.append(item.label)
                    report.order.append((item.label, "match"))
                else:
                    report.non_matches.append(item.label)
                    report.order.append((item.label, "no match"))
            except EvaluationError as err:
                report.errors.append({"device": item.label, "error": err.cause})
                report.order.append((item.label, f"error: {err.cause}"))
    return report


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("expression", help="CEL device selector, e.g. 'device.driver == \"gpu.example.com\"'")
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        type=Path,
        metavar="SLICES",
        help="ResourceSlice YAML/JSON file (multi-document or a List), or a directory's .yaml/.yml/.json "
        "files; repeatable; '-' reads stdin",
    )
    parser.add_argument(
        "-R", "--recursive", action="store_true", help="read the directories of -f/--filename recursively"
    )
    parser.add_argument("--driver", help="only slices of this driver; also the driver of slices without one")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--engine", choices=ENGINES, help="CEL engine (default: $DRA_CEL_ENGINE or cel-expr-python)"
    )
    add_version_argument(parser)


def _slice_files(args: argparse.Namespace) -> list[Path]:
    """-f as the other commands read it (controller.manifests): directories expanded, each file
    once; '-' (stdin) last."""
    named = [str(path) for path in args.files if str(path) != "-"]
    try:
        files = collect(Source(path, args.recursive) for path in named).files
    except ManifestError as err:
        raise InputError(str(err)) from None
    return files + [Path("-")] * (len(named) < len(args.files))


def _run(args: argparse.Namespace) -> int:
    try:
        files = _slice_files(args)
        report = evaluate(args.expression, files, args.driver, args.engine, args.kubernetes_version)
    except CompileError as err:
        print(f"dra-controller cel: compile error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except InputError as err:
        print(f"dra-controller cel: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "json":
        print(json.dumps({"matches": report.matches, "errors": report.errors}, indent=2))
    else:
        for label, outcome in report.order:
            print(f"{label}: {outcome}")
    return EXIT_FAILURE if report.errors else EXIT_OK


register_subcommand(
    Subcommand(
        name="cel",
        help="evaluate a CEL device selector against the devices of ResourceSlice files",
        add_arguments=_add_arguments,
        handler=_run,
    )
)
