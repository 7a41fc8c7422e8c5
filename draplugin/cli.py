"""The `draplugin` command: `draplugin run` serves the kubelet plugin; more subcommands plug in.

Subcommands live in a registry (`dracommon.subcommands`). `run` is defined
here; other modules add theirs by calling `register_subcommand` when imported,
and are listed in `SUBCOMMAND_MODULES` so the parser imports them.

Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad command line or settings.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from dracommon.buildinfo import version
from dracommon.logs import setup_logging
from dracommon.subcommands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandLine, Subcommand
from draplugin import config
from draplugin.config import ConfigError, Settings

if TYPE_CHECKING:
    # argparse: imported where a parser is built (dracommon.subcommands); `run` reads a plain
    # command line without it (run_flags).
    import argparse

    # Imported where `run` serves: gRPC, asyncio and prometheus_client are most of a
    # second command's start-up (`devices`, `cdi-spec`) that never serves.
    import asyncio

    from draplugin.kubelet.interface import Driver
    from draplugin.kubelet.server import KubeletPluginServer
    from draplugin.nodestart import Daemon

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "Subcommand",
    "build_driver",
    "build_parser",
    "main",
    "register_subcommand",
]

# Test hook: "module:function" naming a `(Settings) -> Driver` factory, used by
# `build_driver` in place of the real driver (end-to-end tests of the protocol layer).
DRIVER_FACTORY_ENV: Final = "DRAPLUGIN_DRIVER_FACTORY"

log = logging.getLogger("draplugin.cli")


# Modules that register more subcommands when imported (`devices`: what the
# discovery backend sees, as the ResourceSlices it would publish; `cdi-spec`: the
# CDI spec a claim's containers would get).
SUBCOMMAND_MODULES: tuple[str, ...] = ("draplugin.devices.cli", "draplugin.cdi.cli")

COMMAND_LINE = CommandLine(
    prog="draplugin",
    description="Kubernetes DRA driver for GPUs: the node side (kubelet plugin).",
    modules=SUBCOMMAND_MODULES,
)
register_subcommand = COMMAND_LINE.register
build_parser = COMMAND_LINE.build_parser
# `draplugin run` alone: the same `run` parser without importing the other subcommands' modules
# (the `cdi-spec` preview pulls in the whole prepare plan, ~0.1 s before the daemon even starts).
RUN_LINE = CommandLine(prog=COMMAND_LINE.prog, description=COMMAND_LINE.description, modules=())


class DriverUnavailable(RuntimeError):
    """No driver can be built for these settings."""


def build_driver(settings: Settings) -> Driver:
    """The driver `run` serves. The prepare driver is wired in here."""
    factory_ref = os.environ.get(DRIVER_FACTORY_ENV)
    if factory_ref:
        return _load_factory(factory_ref)(settings)
    # Imported here: it pulls in the Kubernetes client and the device backends.
    from draplugin.prepare.wiring import WiringError, driver_from_settings

    try:
        return driver_from_settings(settings)
    except WiringError as exc:
        raise DriverUnavailable(str(exc)) from exc


def _load_factory(ref: str) -> Callable[[Settings], Driver]:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise DriverUnavailable(f"{DRIVER_FACTORY_ENV}={ref!r} must look like module:function")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise DriverUnavailable(f"{DRIVER_FACTORY_ENV}={ref!r} cannot be loaded: {exc}") from exc
    if not callable(factory):
        raise DriverUnavailable(f"{DRIVER_FACTORY_ENV}={ref!r} is not callable")
    built: Callable[[Settings], Driver] = factory
    return built


# --- run --------------------------------------------------------------------------------------


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    for option in config.RUN_OPTIONS:
        default = f", default {option.default}" if option.default is not None else ""
        # default=None: an absent flag must fall through to the environment variable.
        # A switch given alone means "true"; it still takes an explicit value (--flag=false).
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar=option.env,
            help=f"{option.help} [env {option.env}{default}]",
            nargs="?" if option.boolean else None,
            const="true" if option.boolean else None,
        )


@contextlib.contextmanager
def _metrics_endpoint(host: str, port: int) -> Iterator[None]:
    if port == 0:
        yield
        return
    from draplugin.kubelet.server import PluginServerError
    from draplugin.metrics import serve_metrics

    try:
        endpoint = serve_metrics(host, port)
    except OSError as exc:
        raise PluginServerError(f"cannot serve metrics on {host} port {port}: {exc}") from exc
    log.info("serving Prometheus metrics", extra={"address": host, "port": port})
    try:
        yield
    finally:
        endpoint.close()


class Service(Protocol):
    """What `serve_service` runs: the plugin server alone, or the whole node daemon."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve(settings: Settings, driver: Driver, stop: asyncio.Event | None = None) -> int:
    """Serve `driver` alone (no devices, no ResourceSlices) until `stop` or SIGTERM/SIGINT."""
    from draplugin.kubelet.server import KubeletPluginServer, PluginServerOptions

    options = PluginServerOptions(
        driver_name=settings.driver_name,
        kubelet_root_dir=settings.kubelet_root_dir,
        pod_uid=settings.pod_uid,
        healthcheck_port=settings.healthcheck_port,
        healthcheck_host=settings.healthcheck_address,
    )
    return await serve_service(settings, KubeletPluginServer(driver, options), stop)


async def serve_service(settings: Settings, service: Service, stop: asyncio.Event | None = None) -> int:
    """Run `service` until `stop` is set or SIGTERM/SIGINT arrives; then stop it (sockets removed)."""
    import asyncio
    import signal

    from draplugin.kubelet.metrics import kubelet_metrics
    from draplugin.kubelet.server import PluginServerError
    from draplugin.kubelet.sockets import SocketPathError
    from draplugin.nodestart import NodeUnavailable

    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread, or no signals
            loop.add_signal_handler(signum, stop.set)
            handled.append(signum)
    try:
        await service.start()
        try:
            # After the sockets (prometheus_client and its HTTP server are imports the kubelet's
            # first calls do not need); the protocol layer's series exist before the first scrape.
            kubelet_metrics()
            with _metrics_endpoint(settings.metrics_address, settings.metrics_port):
                await stop.wait()
                log.info("shutting down")
        finally:
            await service.stop()
    except (PluginServerError, SocketPathError) as exc:
        log.error("cannot serve the kubelet plugin", extra={"error": str(exc)})
        return EXIT_FAILURE
    except NodeUnavailable as exc:  # the node daemon, built once the sockets are up
        log.error("cannot build the node daemon", extra={"error": str(exc)})
        return EXIT_FAILURE
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
    log.info("stopped")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    return _run_with(vars(args))


def _run_with(flags: dict[str, str | None]) -> int:
    try:
        settings = config.load(flags)
    except ConfigError as exc:
        print(f"draplugin run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(settings.log_format, settings.log_level)
    log.info(
        "starting",
        extra={
            "version": version(),
            "driver": settings.driver_name,
            "node": settings.node_name,
            "backend": settings.backend,
        },
    )
    with collector_paused():
        import asyncio

        from draplugin.nodestart import StagedNode

    if os.environ.get(DRIVER_FACTORY_ENV):
        # The test hook replaces the whole device side: serve its driver alone.
        try:
            driver = build_driver(settings)
        except DriverUnavailable as exc:
            log.error("cannot build the driver", extra={"error": str(exc)})
            return EXIT_FAILURE
        return asyncio.run(serve(settings, driver))
    # The sockets first; the node daemon (device backends, the API client, the prepare
    # driver's recovery) is imported and built behind them (draplugin.nodestart).
    return asyncio.run(serve_service(settings, StagedNode(settings, _build_node)))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the serving imports (asyncio, grpc, protobuf, the
    kubelet protocol layer), back as it was after them, before anything serves. Module bodies
    leave next to no cyclic garbage, and the collector's 40-odd passes over their objects were a
    few milliseconds of the start before the sockets (as `dra-controller explain` runs without it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build_node(settings: Settings, server: KubeletPluginServer | None) -> Daemon:
    from draplugin.node import build_node  # here, on the builder's thread: most of the plugin's imports

    return build_node(settings, server=server)


RUN = Subcommand(
    name="run",
    help="run the node daemon: publish ResourceSlices, watch device health, serve the kubelet plugin",
    add_arguments=_add_run_arguments,
    handler=_run,
)
register_subcommand(RUN)
RUN_LINE.register(RUN)


# --- entry point ------------------------------------------------------------------------------


def run_flags(words: Sequence[str]) -> dict[str, str | None] | None:
    """`run`'s flags as argparse gives them (each option's dest: its value, None when absent), for a
    command line of only known long flags, each `--flag=value` or `--flag value` (a switch alone:
    "true"); None for anything else, which argparse parses (help, usage errors, values that
    start with a dash). Building argparse's parser for `run` (some 60 options, a help formatter for
    each, shutil for the terminal's width) is a few milliseconds of the start before the sockets;
    tests/unit/test_cli_run.py holds the two to the same answers."""
    options = _RUN_OPTIONS_BY_FLAG
    flags: dict[str, str | None] = dict.fromkeys(option.dest for option in config.RUN_OPTIONS)
    at = 0
    while at < len(words):
        word = words[at]
        flag, sep, value = word.partition("=")
        option = options.get(flag)
        if option is None:
            return None
        at += 1
        if not sep:
            following = words[at] if at < len(words) else None
            if following is not None and not following.startswith("-"):
                value = following  # argparse's nargs="?" takes a word that is not a flag, too
                at += 1
            elif option.boolean and (following is None or following.startswith("--")):
                value = "true"
            else:
                return None  # no value, or one that starts with a dash: argparse decides
        if value == "--":
            return None  # argparse drops a "--" even as a flag's value
        flags[option.dest] = value
    return flags


_RUN_OPTIONS_BY_FLAG: Final = {option.flag: option for option in config.RUN_OPTIONS}


def _run_fast(flags: dict[str, str | None]) -> int:
    """`_run` as `RUN_LINE.main` calls it (dracommon.subcommands): stdout flushed inside, a reader
    gone away (`| head`) answered as there."""
    try:
        code = _run_with(flags)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
    return code


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # Shell completion lists every subcommand, so it gets the whole command line.
    if words[:1] == ["run"] and "_ARGCOMPLETE" not in os.environ:
        flags = run_flags(words[1:])
        if flags is not None:
            return _run_fast(flags)
        return RUN_LINE.main(words)
    return COMMAND_LINE.main(argv)


if __name__ == "__main__":
    sys.exit(main())
