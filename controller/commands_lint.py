"""`dra-controller lint`: check the CEL selectors of DeviceClasses, ResourceClaims and
ResourceClaimTemplates (a template's requests are checked as the claims made from it would be)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from controller.allocation.selectors import Compiler
from controller.cli import EXIT_FAILURE, EXIT_OK, Subcommand, register_subcommand
from controller.commands_common import (
    add_source_arguments,
    emit,
    release_of,
    selector_compiler,
    with_objects,
)
from controller.lint import Report, lint
from controller.objects import ClusterObjects
from controller.podclaims import claim_from_template

CLAIM_PREFIX = "ResourceClaim/"
TEMPLATE_PREFIX = "ResourceClaimTemplate/"


def lint_objects(
    device_classes: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    templates: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    compiler: Compiler | None = None,
) -> Report:
    """Classes and claims, then templates: each template linted as a claim with its name and
    namespace, its findings named `ResourceClaimTemplate/<namespace>/<name>`."""
    report = lint(device_classes, claims, slices, compiler)
    if not templates:
        return report
    as_claims = []
    for template in templates:
        meta = template.get("metadata") or {}
        as_claims.append(
            claim_from_template(template, str(meta.get("namespace") or "default"), str(meta.get("name", "")))
        )
    # A second pass keeps template findings apart from those of a claim with the same name; its
    # class findings repeat the first pass and are dropped.
    for finding in lint(device_classes, as_claims, slices, compiler).findings:
        if finding.object.startswith(CLAIM_PREFIX):
            renamed = TEMPLATE_PREFIX + finding.object[len(CLAIM_PREFIX) :]
            report.findings.append(dataclasses.replace(finding, object=renamed))
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")


@with_objects
def run(args: argparse.Namespace, objects: ClusterObjects) -> int:
    compiler = selector_compiler(release_of(args))
    report = lint_objects(
        objects.device_classes, objects.claims, objects.claim_templates, objects.slices, compiler
    )
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
        help="check DeviceClass, ResourceClaim and ResourceClaimTemplate selectors: compile errors, cost, "
        "no match, unknown or unguarded attributes",
        add_arguments=add_arguments,
        handler=run,
    )
)
