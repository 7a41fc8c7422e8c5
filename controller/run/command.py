"""`dra-controller run`: the controller daemon (pre-allocation, repair, events, metrics).

Every flag has an environment mirror (`DRA_CONTROLLER_<FLAG>`); a flag on the
command line wins over the environment. SIGTERM or SIGINT releases the leader
Lease and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.allocation.features import parse_feature_gates
from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.run.leader import LeaderConfig
from dracommon.drivername import DEFAULT_DRIVER_NAME, check_driver_name
from dracommon.duration import parse_duration
from dracommon.kubeversion import KubernetesVersion, format_version, parse_kubernetes_version

if TYPE_CHECKING:
    from dracommon.kubeapi import KubeApi

log = logging.getLogger(__name__)

ENV_PREFIX = "DRA_CONTROLLER_"


class SettingError(ValueError):
    """A flag or environment value that cannot be used; the message names it."""


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    default: str | None
    parse: Callable[[str], Any] = str
    aliases: tuple[str, ...] = ()
    switch: bool = False  # given alone means "true"; still takes a value (--flag=false)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise ValueError("must be 0 (off) to 65535")
    return port


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds >= 0:
        raise ValueError("must be a number of seconds >= 0")
    return seconds


def _duration(value: str) -> float:
    """Seconds, from a plain number or a Go-style duration (`15s`, `1m30s`, `500ms`)."""
    return parse_duration(value, positive=True)


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError("must be true or false")


def _release(value: str) -> KubernetesVersion:
    return parse_kubernetes_version(value)


def _gates(value: str) -> dict[str, bool]:
    return parse_feature_gates(value)


def _log_format(value: str) -> str:
    if value not in ("text", "json"):
        raise ValueError("must be text or json")
    return value


def _log_level(value: str) -> str:
    if value not in ("debug", "info", "warning", "error"):
        raise ValueError("must be debug, info, warning or error")
    return value


OPTIONS: tuple[Option, ...] = (
    Option("--kubeconfig", "kubeconfig file (default: in-cluster, else $KUBECONFIG / ~/.kube/config)", None),
    Option("--context", "kubeconfig context to use", None),
    Option(
        "--namespace",
        "only handle claims (and pods) in this namespace (default: all namespaces)",
        None,
        aliases=("-n",),  # as kubectl and the other subcommands spell it
    ),
    Option(
        "--driver-name",
        "driver name; annotations are <driver>/preallocate, Events report as <driver>/dra-controller",
        DEFAULT_DRIVER_NAME,
        check_driver_name,
    ),
    Option(
        "--leader-elect",
        "elect one active replica through a Lease (false: this replica always acts; run only one)",
        "true",
        _boolean,
        switch=True,
    ),
    Option(
        "--lease-name", "name of the coordination.k8s.io Lease used for leader election", "dra-controller"
    ),
    Option(
        "--lease-namespace",
        "namespace of the Lease (default: $POD_NAMESPACE, else kube-system)",
        None,
        aliases=("--leader-election-namespace",),
    ),
    Option(
        "--leader-election-lease-duration",
        "how long a Lease stays valid without renewal (seconds, or 15s / 1m)",
        "15s",
        _duration,
    ),
    Option(
        "--leader-election-renew-deadline",
        "a leader that cannot renew for this long steps down; must be below the lease duration",
        "10s",
        _duration,
    ),
    Option("--leader-election-retry-period", "how often a follower tries to take the Lease", "2s", _duration),
    Option(
        "--identity",
        "this replica's name in the Lease (default: $POD_NAME, else hostname plus a random suffix)",
        None,
    ),
    Option("--metrics-port", "port for /metrics and /healthz (0: off)", "8080", _port),
    Option(
        "--kubernetes-version",
        "allocate by the rules and CEL environment of this release, MAJOR.MINOR "
        "(default: the API server's, read at start)",
        None,
        _release,
    ),
    Option(
        "--feature-gates",
        "kube-scheduler's feature gates where they differ from its release's defaults (Name=true,...)",
        "",
        _gates,
    ),
    Option(
        "--event-after-seconds",
        "post a CannotAllocate Event once a claim a pending pod uses stays unallocated this long",
        "60",
        _seconds,
    ),
    Option(
        "--event-interval-seconds", "at most one such Event per claim per this many seconds", "600", _seconds
    ),
    Option(
        "--plugin-namespace",
        "the kubelet plugin's namespace: report its DaemonSet's pods refused by Pod Security (default: off)",
        None,
    ),
    Option("--log-format", "text or json", "text", _log_format),
    Option("--log-level", "debug, info, warning or error", "info", _log_level),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option in OPTIONS:
        default = f", default {option.default}" if option.default is not None else ""
        # default=None so an absent flag falls through to the environment variable.
        parser.add_argument(
            option.flag, *option.aliases, dest=option.dest, default=None,
            metavar=option.env.removeprefix(ENV_PREFIX), help=f"{option.help} [env {option.env}{default}]",
            nargs="?" if option.switch else None, const="true" if option.switch else None,
        )  # fmt: skip


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Flag, else environment, else default; each value parsed and checked."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = getattr(args, option.dest, None)
        source = option.flag
        if raw is None and env.get(option.env):
            raw, source = env[option.env], option.env
        if raw is None:
            raw = option.default
        if raw is None:
            values[option.dest] = None
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as err:
            raise SettingError(f"{source}={raw!r}: {err}") from err
    if values["lease_namespace"] is None:
        values["lease_namespace"] = env.get("POD_NAMESPACE") or "kube-system"
    if values["identity"] is None:
        values["identity"] = env.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    try:
        values["leader_config"] = LeaderConfig(
            lease_duration_s=max(1, round(values["leader_election_lease_duration"])),
            renew_deadline_s=values["leader_election_renew_deadline"],
            # Renew well inside the deadline: every 5 s, or twice per deadline when that is shorter.
            renew_interval_s=min(5.0, values["leader_election_renew_deadline"] / 2),
            retry_period_s=values["leader_election_retry_period"],
        )
    except ValueError as err:
        raise SettingError(f"leader election: {err}") from err
    return values


def cluster_release(api: KubeApi) -> KubernetesVersion:
    """The API server's release; the newest we know (with a warning) when it cannot be read, since
    the scheduler's rules differ by release but a transient error should not stop the controller."""
    from dracommon.kubeapi import ApiError
    from dracommon.kubeversion import NEWEST_KNOWN, VersionError, server_version

    try:
        return server_version(api)
    except (ApiError, OSError, VersionError) as err:
        log.warning(
            "cannot read the API server's release; using the newest known (set --kubernetes-version)",
            extra={"error": str(err), "release": format_version(NEWEST_KNOWN)},
        )
        return NEWEST_KNOWN


def run(args: argparse.Namespace) -> int:
    from dracommon.logs import setup_logging

    try:
        values = resolve(args)
    except SettingError as err:
        sys.stderr.write(f"dra-controller run: error: {err}\n")
        return EXIT_USAGE
    setup_logging(values["log_format"], values["log_level"])
    from dracommon.buildinfo import version

    log.info("starting", extra={"version": version(), "driver": values["driver_name"]})

    from controller.run.daemon import ControllerDaemon, DaemonSettings
    from dracommon.kubeapi import KubeApi, KubeConfigError, load_api_client

    try:
        api = load_api_client(values["kubeconfig"], values["context"])
    except KubeConfigError as err:
        log.error("cannot reach the cluster", extra={"error": str(err)})
        return EXIT_FAILURE
    release = values["kubernetes_version"] or cluster_release(KubeApi(api))
    log.info("allocating by the rules of Kubernetes", extra={"release": format_version(release)})
    settings = DaemonSettings(
        release=release,
        feature_gates=values["feature_gates"],
        identity=values["identity"],
        lease_name=values["lease_name"],
        lease_namespace=values["lease_namespace"],
        namespace=values["namespace"],
        metrics_port=values["metrics_port"],
        driver_name=values["driver_name"],
        leader_elect=values["leader_elect"],
        leader_config=values["leader_config"],
        event_after_s=values["event_after_seconds"],
        event_interval_s=values["event_interval_seconds"],
        plugin_namespace=values["plugin_namespace"],
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    daemon = ControllerDaemon(KubeApi(api), settings)
    try:
        daemon.start()
    except OSError as err:
        log.error("cannot start", extra={"error": str(err)})
        return EXIT_FAILURE
    daemon.wait(stop)
    log.info("shutting down")
    daemon.stop()
    return EXIT_OK


register_subcommand(
    Subcommand(
        name="run",
        help="run the controller: pre-allocate annotated claims, explain stuck claims in Events",
        add_arguments=add_arguments,
        handler=run,
    )
)
