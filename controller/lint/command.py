"""`dra-controller lint`: check the CEL selectors of DeviceClasses, ResourceClaims and
ResourceClaimTemplates the way kube-scheduler evaluates them (a template's requests are checked
as the claims made from it would be), and where the objects given say a request cannot be placed."""

from __future__ import annotations

import argparse

from controller.cli import EXIT_FAILURE, EXIT_OK, Subcommand, register_subcommand
from controller.lint.linter import lint
from controller.objects import ClusterObjects
from controller.options import (
    add_namespace_arguments,
    add_source_arguments,
    build_allocator,
    chosen_namespace,
    emit,
    extended_resources_enabled,
    gates_of,
    in_namespace,
    release_of,
    with_objects,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    # -n: only that namespace's claims, templates, pods and workloads are judged; the devices
    # other namespaces' allocated claims hold still count.
    add_namespace_arguments(parser, every_by_default=True)
    parser.add_argument("--strict", action="store_true", help="fail on warnings too")
    # From a cluster, also list Deployments, Jobs, ...: their pod templates are linted as pods.
    parser.set_defaults(list_workloads=True)


@with_objects
def run(args: argparse.Namespace, objects: ClusterObjects) -> int:
    allocator = build_allocator(objects, release_of(args), gates_of(args))
    judged = in_namespace(objects, chosen_namespace(args))
    report = lint(judged, allocator, extended_resources=extended_resources_enabled(args))
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
        help="check DeviceClass, ResourceClaim and ResourceClaimTemplate selectors as the scheduler "
        "evaluates them (compile errors, cost, runtime errors, no match, unknown or unguarded attributes) "
        "and requests it cannot place (untolerated taints, All mode on incomplete pools, no device on "
        "the pod's nodes, GPU nodes whose taints the pods do not tolerate)",
        add_arguments=add_arguments,
        handler=run,
    )
)
