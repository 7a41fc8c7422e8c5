"""`dra-controller top`: how busy each claimed GPU in the cluster is, most waste first.

Like `kubectl top`: one table of claimed devices (node, device, model, claim, pods,
utilization, memory used/total, how long the claim has been idle), read from the node
plugins' Prometheus endpoints (`controller.top.sources`): the chart's plugin pods through
the API server's pod proxy, any `--endpoint URL` directly, and any `--metrics-file` saved
scrape. An endpoint that cannot be read is named on stderr with the reason and the rest are
still shown; the exit code is then 1. `-o wide` adds each device's UUID and the endpoint its
row came from.

JSON/YAML: `{"devices": [row, ...], "errors": [{"endpoint", "error"}, ...]}`, rows as
`ClaimedDevice.to_json()` (ratios 0..1, sizes in bytes, `idleSeconds`, `idle`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.options import add_namespace_arguments, chosen_namespace, emit
from controller.top import sources
from controller.top.snapshot import ClaimedDevice, ExpositionError, read_exposition
from controller.top.table import by_waste, render, select

# wide: the table with the device UUID and the endpoint each row was read from.
OUTPUT_FORMATS = ("table", "wide", "json", "yaml")


def _endpoint_argument(text: str) -> str:
    try:
        return sources.endpoint_url(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds greater than 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_namespace_arguments(parser, every_by_default=True)
    parser.add_argument("--node", help="only devices of this node (and only that node's plugin is read)")
    parser.add_argument(
        "--idle", action="store_true", help="only claims flagged idle past the plugin's threshold"
    )
    parser.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="table", help="output format")
    parser.add_argument(
        "--endpoint",
        action="append",
        type=_endpoint_argument,
        default=[],
        metavar="URL",
        help="also read this plugin /metrics URL directly (repeatable), e.g. for a plugin run outside the "
        "cluster; with only --endpoint/--metrics-file and no --kubeconfig/--context, the cluster is not "
        "asked",
    )
    parser.add_argument(
        "--metrics-file",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="also read a plugin's /metrics saved to FILE (repeatable), e.g. `curl -s URL > FILE`",
    )
    parser.add_argument(
        "--selector",
        default=sources.DEFAULT_SELECTOR,
        help=f"label selector of the kubelet plugin pods (default: {sources.DEFAULT_SELECTOR})",
    )
    parser.add_argument(
        "--plugin-namespace", help="look for plugin pods only in this namespace (default: every namespace)"
    )
    parser.add_argument(
        "--timeout", type=_positive_seconds, default=sources.SCRAPE_TIMEOUT_S, metavar="SECONDS",
        help=f"per endpoint (default {sources.SCRAPE_TIMEOUT_S:.0f})",
    )  # fmt: skip
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context to use")


def _asks_cluster(args: argparse.Namespace) -> bool:
    """False for only --endpoint URLs and --metrics-file files, and nothing that names a cluster."""
    return not (args.endpoint or args.metrics_file) or bool(args.kubeconfig or args.context)


def run(args: argparse.Namespace) -> int:
    endpoints: list[sources.Endpoint] = list(sources.url_endpoints(args.endpoint, args.timeout))
    endpoints.extend(sources.FileEndpoint(path) for path in args.metrics_file)
    notes: list[str] = []
    api_client: Any = None
    try:
        if _asks_cluster(args):
            from dracommon.kubeapi import ApiError, KubeApi, KubeConfigError, load_api_client

            try:
                api_client = load_api_client(args.kubeconfig, args.context)
                found = sources.discover_plugin_pods(
                    KubeApi(api_client, timeout_s=args.timeout),
                    selector=args.selector,
                    namespace=args.plugin_namespace,
                    node=args.node,
                    timeout_s=args.timeout,
                )
            except KubeConfigError as err:
                sys.stderr.write(f"error: {err}\n")
                return EXIT_USAGE
            except ApiError as err:
                sys.stderr.write(f"error: cannot list the kubelet plugin pods: {err}\n")
                return EXIT_USAGE
            endpoints.extend(found.endpoints)
            notes.extend(f"skipped {why}" for why in found.skipped)
            if not endpoints:
                where = f" in namespace {args.plugin_namespace}" if args.plugin_namespace else ""
                on_node = f" on node {args.node}" if args.node else ""
                sys.stderr.write(
                    f"error: no running kubelet plugin pod with labels {args.selector}{where}{on_node} "
                    "serves metrics (--selector, --plugin-namespace; or --endpoint URL for a plugin "
                    "outside the cluster)\n"
                )
                for note in notes:
                    sys.stderr.write(f"  {note}\n")
                return EXIT_FAILURE
        results = sources.scrape_all(endpoints)
    finally:
        if api_client is not None:
            api_client.close()
    rows: list[ClaimedDevice] = []
    errors: list[dict[str, str]] = []
    for result in results:
        if isinstance(result, sources.ScrapeFailure):
            errors.append({"endpoint": result.endpoint, "error": result.error})
            continue
        try:
            usage = read_exposition(result.text, result.endpoint)
        except ExpositionError as err:
            errors.append({"endpoint": result.endpoint, "error": str(err)})
            continue
        if usage.sampled_devices == 0:
            notes.append(
                f"{result.endpoint} exports no device usage (usage sampling off: --usage-sample-interval 0, "
                "or a node without devices)"
            )
        rows.extend(usage.rows)
    shown = by_waste(select(rows, namespace=chosen_namespace(args), node=args.node, idle_only=args.idle))
    data = {"devices": [r.to_json() for r in shown], "errors": errors}
    emit(args, data, lambda: _table_text(shown, args))
    for note in notes:
        sys.stderr.write(f"note: {note}\n")
    for error in errors:
        sys.stderr.write(f"error: cannot read {error['endpoint']}: {error['error']}\n")
    return EXIT_FAILURE if errors else EXIT_OK


def _table_text(rows: list[ClaimedDevice], args: argparse.Namespace) -> str:
    if rows:
        return render(rows, wide=args.output == "wide")
    which = "idle claims" if args.idle else "claimed devices"
    return f"No {which} found."


register_subcommand(
    Subcommand(
        name="top",
        help="how busy each claimed GPU is (utilization, memory, idle time), most waste first, read from the "
        "node plugins' metrics endpoints",
        add_arguments=add_arguments,
        handler=run,
    )
)
