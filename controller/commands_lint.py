"""`dra-controller lint`: check the CEL selectors of DeviceClasses and ResourceClaims."""

from __future__ import annotations

import argparse
import sys

from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.commands_common import (
    InputError,
    add_source_arguments,
    emit,
    load_objects,
    release_of,
    selector_compiler,
)
from controller.lint import lint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")


def run(args: argparse.Namespace) -> int:
    try:
        objects = load_objects(args)
    except InputError as err:
        sys.stderr.write(f"error: {err}\n")
        return EXIT_USAGE
    compiler = selector_compiler(release_of(args))
    report = lint(objects.device_classes, objects.claims, objects.slices, compiler)
    emit(
        args,
        report.to_json(),
        lambda: "\n".join(f.to_text() for f in report.findings) or "no findings",
    )
    failed = report.errors > 0 or (args.strict and bool(report.findings))
    return EXIT_FAILURE if failed else EXIT_OK


register_subcommand(
    Subcommand(
        name="lint",
        help="check DeviceClass and ResourceClaim selectors: compile errors, cost, no match, unknown or "
        "unguarded attributes",
        add_arguments=add_arguments,
        handler=run,
    )
)
