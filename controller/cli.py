"""The `dra-controller` command. Subcommands plug in through a registry.

Each subcommand lives in its own module, which calls `register_subcommand` when
imported; the module is listed in `SUBCOMMAND_MODULES` so the parser imports it
(lazily, only when the CLI is built, so `import controller.cli` stays cheap).
To add one (simulate, explain, lint, run, ...): write `controller/<area>/cli.py`
with a `Subcommand`, register it at import, and append the module name below.

Exit codes: 0 success, 1 the command ran and found failures, 2 bad command line or input.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


@dataclass(frozen=True, slots=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


_SUBCOMMANDS: dict[str, Subcommand] = {}

# Modules that register subcommands when imported, in the order `--help` lists them.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "controller.cel.cli",
    "controller.commands_simulate",
    "controller.commands_explain",
    "controller.commands_lint",
    "controller.commands_run",
)


def register_subcommand(command: Subcommand) -> None:
    if command.name in _SUBCOMMANDS and _SUBCOMMANDS[command.name] != command:
        raise ValueError(f"subcommand {command.name!r} is already registered")
    _SUBCOMMANDS[command.name] = command


def build_parser() -> argparse.ArgumentParser:
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module)
    parser = argparse.ArgumentParser(
        prog="dra-controller",
        description="Cluster-side tools of the GPU DRA driver: CEL selectors, allocation, explain, lint.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _SUBCOMMANDS.values():
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(handler=command.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    namespace = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in ("handler", "command")})
    return handler(namespace)


if __name__ == "__main__":
    # Run as `python -m controller.cli`, this file is `__main__`, while the subcommand modules
    # register with `controller.cli`, a second copy: use that copy, which holds the registry.
    from controller.cli import main as registered_main

    sys.exit(registered_main())
