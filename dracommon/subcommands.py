"""A subcommand registry, shared by the `draplugin` and `dra-controller` commands.

Each subcommand lives in its own module, which registers a `Subcommand` when
imported. A command line lists those modules and imports them only when its
parser is built, so importing the CLI module itself stays cheap.

Exit codes of both commands: 0 success, 1 the command ran and failed (or found
failures), 2 bad command line, settings or input.
"""

from __future__ import annotations

import argparse
import importlib
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


class CommandLine:
    """One program's subcommands, in the order `--help` lists them."""

    def __init__(self, prog: str, description: str, modules: Sequence[str]) -> None:
        self.prog = prog
        self.description = description
        self.modules = tuple(modules)
        self._commands: dict[str, Subcommand] = {}

    def register(self, command: Subcommand) -> None:
        if command.name in self._commands and self._commands[command.name] != command:
            raise ValueError(f"subcommand {command.name!r} is already registered")
        self._commands[command.name] = command

    def unregister(self, name: str) -> None:
        self._commands.pop(name, None)

    def build_parser(self) -> argparse.ArgumentParser:
        for module in self.modules:
            importlib.import_module(module)
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description)
        subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
        for command in self._commands.values():
            sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
            command.add_arguments(sub)
            sub.set_defaults(handler=command.handler)
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        args = self.build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        # Handlers see only their own options, not the registry's bookkeeping.
        options = {k: v for k, v in vars(args).items() if k not in ("handler", "command")}
        return handler(argparse.Namespace(**options))
