"""The interpreter's floor for the kubelet plugin's start-up: a bare script that only serves the
kubelet's two sockets (plugin registration and DRA v1) with the same generated stubs the plugin
uses, and nothing else (no config models, no API client, no metrics, no devices).

`bench.prepare --part rss` starts it beside ours and the Go peer and times it the same way, spawn to
both sockets existing, so ours/floor shows how much of our start and RSS is the plugin's own work and
how much is Python + asyncio + grpc.

With `--imports FILE` it first imports every module FILE names, one per line: `bench.prepare`
writes there each module outside the project that our plugin had imported once it had published
(the libraries and the standard library it uses), so that this floor's RSS is ours less only our
own modules and what the running plugin builds.

    python -m bench.plugin_floor [--imports FILE] REGISTRATION_SOCKET DRA_SOCKET
"""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
from pathlib import Path

import grpc

from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as dra_grpc
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc


async def serve(registration_path: str, dra_path: str) -> None:
    # The generated base servicers answer UNIMPLEMENTED: the floor measures serving, not answers.
    registration_server = grpc.aio.server()
    registration = reg_grpc.RegistrationServicer()  # type: ignore[abstract]
    reg_grpc.add_RegistrationServicer_to_server(registration, registration_server)
    dra_server = grpc.aio.server()
    plugin = dra_grpc.DRAPluginServicer()  # type: ignore[abstract]
    dra_grpc.add_DRAPluginServicer_to_server(plugin, dra_server)
    servers = (registration_server, dra_server)
    for server, path in zip(servers, (registration_path, dra_path), strict=True):
        server.add_insecure_port(f"unix://{path}")
        await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop(None)


def import_listed(path: Path) -> None:
    """Import each module `path` names (blank lines skipped). The list comes from `-X importtime`,
    which names failed attempts too (an optional dependency looked for and absent): such a module
    fails here as it did in the plugin, same interpreter, same packages, and is passed over."""
    for line in path.read_text().splitlines():
        if name := line.strip():
            try:
                importlib.import_module(name)
            except ImportError:
                continue


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "--imports":
        import_listed(Path(argv[1]))
        argv = argv[2:]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(serve(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
