"""The `dra-controller` command. Subcommands plug in through a registry.

Each subcommand lives in its own module, which calls `register_subcommand` when
imported; the module is listed in `SUBCOMMAND_MODULES` so the parser imports it
(the registry is `dracommon.subcommands`, shared with the `draplugin` command).
To add one: write a module with a `Subcommand`, register it at import, and
append the module name below.

Exit codes: 0 success, 1 the command ran and found failures, 2 bad command line or input.

The same commands are a kubectl plugin: `kubectl-dra` on PATH makes `kubectl dra explain
pod/x` work, and `kubectl_complete-dra` answers kubectl's completion for it (docs/cli.md).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence

from dracommon.subcommands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CommandLine, Subcommand

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "Subcommand",
    "build_parser",
    "main",
    "register_subcommand",
]

# Each subcommand and the module that registers it when imported, in the order `--help` lists
# them. A command line that names a subcommand imports its module alone (explain at 1,000 nodes
# was measured against 3x a 0.15 s JSON parse: the other subcommands' imports cost ~30 ms).
SUBCOMMAND_HOMES: dict[str, str] = {
    "cel": "controller.cel.command",
    "simulate": "controller.simulate.command",
    "explain": "controller.explain.command",
    "lint": "controller.lint.command",
    "run": "controller.run.command",
    "top": "controller.top.command",
    "migrate": "controller.migrate.command",
}
SUBCOMMAND_MODULES: tuple[str, ...] = tuple(SUBCOMMAND_HOMES.values())


COMMAND_LINE = CommandLine(
    prog="dra-controller",
    description="Cluster-side tools of the GPU DRA driver: CEL selectors, allocation, explain, lint.",
    modules=SUBCOMMAND_MODULES,
    homes=SUBCOMMAND_HOMES,
)
register_subcommand = COMMAND_LINE.register
build_parser = COMMAND_LINE.build_parser


# What kubectl shows for the plugin (`kubectl dra ...`), in usage lines and completion.
KUBECTL_PLUGIN_PROG = "kubectl dra"


# Commands that end holding a fleet's objects (1,000 nodes' slices, the allocator's views) and
# register nothing that must run at exit: freeing those objects one by one as the interpreter
# shuts down took ~35 ms of explain's 0.45 s of CPU at 1,000 nodes, where the process's end
# frees them at once.
EXIT_WITHOUT_TEARDOWN = frozenset({"explain", "simulate"})
# Commands that run without the cyclic collector from the start: explain answers one question
# about a bounded set of objects and ends. Its imports (about 80 modules) and its work make
# trees without cycles, and the collector's passes over them freed nothing: ~40 passes over
# the start-up imports alone, 5 to 10 ms of its ~0.3 s at 1,000 nodes.
WITHOUT_COLLECTOR = frozenset({"explain"})


def main(argv: Sequence[str] | None = None) -> int:
    return COMMAND_LINE.main(argv)


def console_main() -> None:
    """The `dra-controller` program: `main` on the command line, then the process ends (for
    EXIT_WITHOUT_TEARDOWN's commands without the interpreter's teardown, output flushed first)."""
    words = sys.argv[1:]
    if words and words[0] in WITHOUT_COLLECTOR:
        gc.disable()
    code = main(words)
    if words and words[0] in EXIT_WITHOUT_TEARDOWN:
        _end_now(code)
    sys.exit(code)


def _end_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        code = code or 1  # the reader went away: as main answers a closed pipe
    os._exit(code)


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """The `kubectl-dra` entry point: kubectl runs it with the words after `kubectl dra`."""
    return COMMAND_LINE.main(argv, prog=KUBECTL_PLUGIN_PROG)


def kubectl_complete(argv: Sequence[str] | None = None) -> int:
    """The `kubectl_complete-dra` entry point, which kubectl's own shell completion runs."""
    words = sys.argv[1:] if argv is None else argv
    return COMMAND_LINE.kubectl_completions(words, KUBECTL_PLUGIN_PROG, sys.stdout)


if __name__ == "__main__":
    # Run as `python -m controller.cli`, this file is `__main__`, while the subcommand modules
    # register with `controller.cli`, a second copy: use that copy, which holds the registry.
    from controller.cli import console_main as registered_main

    registered_main()
