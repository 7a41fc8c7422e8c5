"""Options and helpers shared by simulate, explain and lint: where objects come from
(manifests with -f/--filename or --objects, else the cluster as kubectl would reach it), which
namespace (-n/--namespace, -A/--all-namespaces), output format, and the Kubernetes release whose
rules to follow."""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from collections.abc import Callable
from typing import Any

from controller.allocation.features import Features, parse_feature_gates
from controller.allocation.nodes import Node
from controller.allocation.selectors import Compiler
from controller.cel import compile_selector, versions
from controller.cel.versions import VERSION_ENV
from controller.manifests import Source, collect, duplicates
from controller.objects import ClusterObjects, ManifestError, load_files, load_from_cluster
from controller.scheduler import extendedclaim
from controller.scheduler.allocator import Allocator
from dracommon.kubeversion import (
    NEWEST_KNOWN,
    KubernetesVersion,
    VersionError,
    format_version,
    parse_kubernetes_version,
)
from dracommon.subcommands import EXIT_USAGE

OUTPUT_FORMATS = ("text", "yaml", "json")


class InputError(Exception):
    """Objects could not be loaded; the message says which and why."""


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="FILE_OR_DIR",
        help="work offline on YAML/JSON manifests: a file, or a directory's .yaml/.yml/.json files "
        "(repeatable; with -R, directories below too)",
    )
    parser.add_argument(
        "-R", "--recursive", action="store_true", help="read the directories of -f/--filename recursively"
    )
    parser.add_argument(
        "--objects",
        nargs="+",
        default=[],
        metavar="FILE_OR_DIR",
        help="work offline on YAML/JSON manifests (files, or directories searched recursively); "
        "the older spelling of -f ... -R",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context to use")
    parser.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="text", help="output format")
    add_version_argument(parser)
    add_gates_argument(parser)


def add_namespace_arguments(parser: argparse.ArgumentParser, *, every_by_default: bool) -> None:
    """-n/--namespace and -A/--all-namespaces, which exclude each other. `every_by_default`: a
    command over the whole cluster (simulate, lint, top) reads every namespace unless -n names
    one; otherwise (explain) the context's namespace, as kubectl does."""
    group = parser.add_mutually_exclusive_group()
    default = "every namespace" if every_by_default else "the kubeconfig context's namespace, else default"
    group.add_argument("-n", "--namespace", help=f"only this namespace (default: {default})")
    group.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def chosen_namespace(args: argparse.Namespace) -> str | None:
    """The namespace -n names; None for -A or none named (a whole-cluster command's default)."""
    if getattr(args, "all_namespaces", False):
        return None
    namespace: str | None = getattr(args, "namespace", None)
    return namespace


def default_namespace(args: argparse.Namespace) -> str:
    """-n, else (reading a cluster) the namespace of the kubeconfig context, else "default"."""
    named = chosen_namespace(args)
    if named:
        return named
    if manifest_sources(args):
        return "default"
    from dracommon.kubeapi import context_namespace

    return context_namespace(args.kubeconfig, args.context) or "default"


def in_namespace(objects: ClusterObjects, namespace: str | None) -> ClusterObjects:
    """The objects with only `namespace`'s namespaced ones (claims, templates, pods, workloads);
    all of them for None. Cluster-scoped objects (classes, slices, nodes) stay."""
    if namespace is None:
        return objects

    def keep(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [o for o in items if ((o.get("metadata") or {}).get("namespace") or "default") == namespace]

    return ClusterObjects(
        device_classes=objects.device_classes,
        slices=objects.slices,
        claims=keep(objects.claims),
        claim_templates=keep(objects.claim_templates),
        taint_rules=objects.taint_rules,
        nodes=objects.nodes,
        pods=keep(objects.pods),
        workloads=keep(objects.workloads),
    )


def kubernetes_version_argument(text: str) -> KubernetesVersion:
    try:
        return parse_kubernetes_version(text)
    except VersionError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubernetes-version",
        type=kubernetes_version_argument,
        metavar="MAJOR.MINOR",
        help=f"follow the CEL environment and allocation rules of this release "
        f"(default: ${VERSION_ENV}, else {format_version(NEWEST_KNOWN)})",
    )


def feature_gates_argument(text: str) -> dict[str, bool]:
    try:
        return parse_feature_gates(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_gates_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--feature-gates",
        type=feature_gates_argument,
        default={},
        metavar="Name=true,...",
        help="the cluster's feature gates where they differ from the release's defaults (as passed to "
        "kube-scheduler: DRAExtendedResource, DRAConsumableCapacity, ...)",
    )


def gates_of(args: argparse.Namespace) -> dict[str, bool]:
    gates: dict[str, bool] = getattr(args, "feature_gates", None) or {}
    return gates


def extended_resources_enabled(args: argparse.Namespace) -> bool:
    """The DRAExtendedResource gate: --feature-gates where it names it, else the release's default."""
    return gates_of(args).get("DRAExtendedResource", extendedclaim.enabled_in(release_of(args)[1]))


def release_of(args: argparse.Namespace) -> KubernetesVersion:
    """--kubernetes-version, else $DRA_KUBERNETES_VERSION, else the newest release we know."""
    chosen: KubernetesVersion | None = getattr(args, "kubernetes_version", None)
    return chosen if chosen is not None else versions.default_version()


def manifest_sources(args: argparse.Namespace) -> list[Source]:
    """--objects (directories always recursive) and -f (recursive with -R), in that order."""
    return [Source(p, True) for p in getattr(args, "objects", None) or []] + [
        Source(p, getattr(args, "recursive", False)) for p in getattr(args, "filename", None) or []
    ]


def load_manifest_sources(sources: list[Source]) -> ClusterObjects:
    """The objects of the manifests, each file read once (a note on stderr for a file named
    twice); InputError for an unreadable file or an object two files define."""
    try:
        found = collect(sources)
        objects = load_files(found.files)
        repeated = duplicates(objects, found.files)
    except (ManifestError, OSError) as err:
        raise InputError(str(err)) from err
    for path in found.repeated:
        sys.stderr.write(f"note: {path} is named more than once; read once\n")
    if repeated:
        raise InputError("; ".join(repeated))
    return objects


def load_objects(args: argparse.Namespace) -> ClusterObjects:
    sources = manifest_sources(args)
    if sources:
        return load_manifest_sources(sources)
    from dracommon.kubeapi import ApiError, KubeApi, KubeConfigError, load_api_client

    try:
        api = load_api_client(args.kubeconfig, args.context)
    except KubeConfigError as err:
        raise InputError(str(err)) from err
    try:
        with api:
            # A subcommand that judges workloads' pod templates (lint) sets `list_workloads`.
            return load_from_cluster(KubeApi(api), include_workloads=getattr(args, "list_workloads", False))
    except (ApiError, OSError) as err:
        raise InputError(f"cannot read objects from the cluster: {err}") from err


def with_objects(
    handler: Callable[[argparse.Namespace, ClusterObjects], int],
) -> Callable[[argparse.Namespace], int]:
    """A subcommand handler that works on the loaded objects; a load failure is reported on
    stderr and exits EXIT_USAGE before the handler runs."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            objects = load_objects(args)
        except InputError as err:
            sys.stderr.write(f"error: {err}\n")
            return EXIT_USAGE
        # The loaded objects live as long as the command: frozen, the collector's passes skip
        # them (a quarter of explain's time at 1,000 nodes); unfrozen afterwards, so a process
        # that runs several commands (the tests) keeps nothing past its command.
        gc.freeze()
        try:
            return handler(args, objects)
        finally:
            gc.unfreeze()

    return run


def build_allocator(
    objects: ClusterObjects, release: KubernetesVersion = NEWEST_KNOWN, gates: dict[str, bool] | None = None
) -> Allocator:
    """An allocator with the rules and CEL environment of `release` and its default feature gates,
    switched as `gates` says."""
    return Allocator(
        device_classes=objects.device_classes,
        slices=objects.slices,
        allocated_claims=[c for c in objects.claims if (c.get("status") or {}).get("allocation")],
        taint_rules=objects.taint_rules,
        features=Features.for_release(release[1]).with_gates(gates or {}),
        compiler=selector_compiler(release),
    )


def selector_compiler(release: KubernetesVersion) -> Compiler:
    """compile_selector for the CEL environment of `release`."""
    compiler: Compiler = functools.partial(compile_selector, kubernetes_version=release)
    return compiler


def cluster_nodes(objects: ClusterObjects, allocator: Allocator) -> list[Node]:
    """Node objects when we have them (labels matter for node selectors), else the nodes slices name."""
    if objects.nodes:
        return sorted((Node.from_object(n) for n in objects.nodes), key=lambda n: n.name)
    return [Node(name) for name in allocator.node_names()]


def find_node(objects: ClusterObjects, name: str) -> Node:
    for node in objects.nodes:
        if (node.get("metadata") or {}).get("name") == name:
            return Node.from_object(node)
    return Node(name)


def emit(args: argparse.Namespace, data: Any, text: Callable[[], str]) -> None:
    if args.output == "json":
        json.dump(data, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    elif args.output == "yaml":
        import yaml  # here: offline commands read YAML without PyYAML (dracommon.yamlload)

        yaml.safe_dump(data, sys.stdout, sort_keys=False)
    else:
        sys.stdout.write(text() + "\n")
