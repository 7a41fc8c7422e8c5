"""`dra-controller explain CLAIM`: why a claim cannot be allocated, filter by filter."""

from __future__ import annotations

import argparse
import sys

from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.commands_common import (
    InputError,
    add_source_arguments,
    build_allocator,
    cluster_nodes,
    emit,
    find_node,
    load_objects,
    release_of,
)
from controller.explain import explain_claim


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("claim", metavar="CLAIM", help="name of the ResourceClaim")
    parser.add_argument("-n", "--namespace", default="default", help="namespace of the claim")
    parser.add_argument("--node", help="explain for this node only (default: every node)")
    add_source_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        objects = load_objects(args)
    except InputError as err:
        sys.stderr.write(f"error: {err}\n")
        return EXIT_USAGE
    claim = objects.find_claim(args.claim, args.namespace)
    if claim is None:
        sys.stderr.write(f"error: ResourceClaim {args.namespace}/{args.claim} not found\n")
        return EXIT_USAGE
    allocator = build_allocator(objects, release_of(args))
    nodes = [find_node(objects, args.node)] if args.node else cluster_nodes(objects, allocator)
    explanation = explain_claim(allocator, claim, nodes or None)
    emit(args, explanation.to_json(), explanation.to_text)
    allocatable = explanation.allocated or any(n.allocatable for n in explanation.nodes)
    return EXIT_OK if allocatable else EXIT_FAILURE


register_subcommand(
    Subcommand(
        name="explain",
        help="explain why a ResourceClaim cannot be allocated: devices per node/pool and what removed them",
        add_arguments=add_arguments,
        handler=run,
    )
)
