"""A subcommand registry, shared by the `draplugin` and `dra-controller` commands.

Each subcommand lives in its own module, which registers a `Subcommand` when
imported. A command line lists those modules and imports them only when its
parser is built, so importing the CLI module itself stays cheap.

Exit codes of both commands: 0 success, 1 the command ran and failed (or found
failures), 2 bad command line, settings or input.

Habits both programs share with kubectl: `--version`; a flag is spelled out in full
(argparse's prefix matching is off, so `--obj` is no silent `--objects`); an unknown flag
is answered with the usage of the subcommand it was given to; output piped into a reader
that stops early (`| head`) ends quietly; and shell completion through `argcomplete`,
which answers when the shell's completion script sets `_ARGCOMPLETE`.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    # Imported where a parser is built: argparse (with gettext) is a millisecond or two of every
    # command's start, and the kubelet plugin's `run` reads a plain command line without it
    # (draplugin.cli.run_flags).
    import argparse

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


@functools.cache
def _version_action() -> type[argparse.Action]:
    import argparse

    class _VersionAction(argparse._VersionAction):
        """argparse's `version` action (same help and output), with the version line made when
        `--version` is given rather than when the parser is built: the lookup costs start-up."""

        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: str | Sequence[Any] | None,
            option_string: str | None = None,
        ) -> None:
            from dracommon.buildinfo import version_line  # platform and the version lookup: --version only

            self.version = version_line(parser.prog)
            super().__call__(parser, namespace, values, option_string)

    return _VersionAction


@dataclass(frozen=True, slots=True)
class Subcommand:
    """One subcommand: its name and help, its arguments and its handler."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


class CommandLine:
    """One program's subcommands, in the order `--help` lists them."""

    def __init__(
        self, prog: str, description: str, modules: Sequence[str], homes: Mapping[str, str] | None = None
    ) -> None:
        self.prog = prog
        self.description = description
        self.modules = tuple(modules)
        # The module that registers each subcommand (where known): a command line that names one
        # imports only that module, not every subcommand's dependencies.
        self.homes = dict(homes or {})
        self._commands: dict[str, Subcommand] = {}

    def register(self, command: Subcommand) -> None:
        if command.name in self._commands and self._commands[command.name] != command:
            raise ValueError(f"subcommand {command.name!r} is already registered")
        self._commands[command.name] = command

    def unregister(self, name: str) -> None:
        self._commands.pop(name, None)

    def build_parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        return self._build(prog)[0]

    def modules_for(self, argv: Sequence[str]) -> tuple[str, ...]:
        """The modules a command line needs: the named subcommand's alone, where its home is known
        (not for shell completion, which lists every subcommand); else all of them."""
        if argv and argv[0] in self.homes and "_ARGCOMPLETE" not in os.environ:
            return (self.homes[argv[0]],)
        return self.modules

    def _build(
        self, prog: str | None, modules: Sequence[str] | None = None
    ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
        """The parser (named `prog`, default this program's name) and each subcommand's parser,
        with the subcommands of `modules` (default: all)."""
        import argparse

        for module in self.modules if modules is None else modules:
            importlib.import_module(module)
        name = prog or self.prog
        parser = argparse.ArgumentParser(prog=name, description=self.description, allow_abbrev=False)
        parser.add_argument("--version", action=_version_action())
        subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
        parsers: dict[str, argparse.ArgumentParser] = {}
        for command in self._commands.values():
            sub = subparsers.add_parser(
                command.name, help=command.help, description=command.help, allow_abbrev=False
            )
            command.add_arguments(sub)
            sub.set_defaults(handler=command.handler)
            parsers[command.name] = sub
        return parser, parsers

    def main(self, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
        import argparse

        words = sys.argv[1:] if argv is None else list(argv)
        parser, parsers = self._build(prog, self.modules_for(words))
        if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answer and exit
            import argcomplete

            argcomplete.autocomplete(parser)
        args, unknown = parser.parse_known_args(words)
        if unknown:
            # argparse reports a subcommand's unknown flag from the top parser, with the top
            # usage; the subcommand's own usage shows which flags it takes (exits 2).
            parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
        handler: Callable[[argparse.Namespace], int] = args.handler
        # Handlers see only their own options, not the registry's bookkeeping.
        options = {k: v for k, v in vars(args).items() if k not in ("handler", "command")}
        try:
            code = handler(argparse.Namespace(**options))
            sys.stdout.flush()  # inside the try: a late flush at exit would print a traceback
        except BrokenPipeError:
            # The reader went away (`| head`). As Python's documentation on SIGPIPE advises:
            # point stdout at /dev/null so the interpreter's own flush at exit stays quiet.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_FAILURE
        return code

    def kubectl_completions(self, words: Sequence[str], prog: str, out: TextIO) -> int:
        """Answer kubectl's plugin completion (kubectl 1.26+ runs `kubectl_complete-<plugin> WORD...
        PARTIAL` for `kubectl <plugin> WORD... PARTIAL<TAB>`): one candidate a line, then `:4`,
        cobra's ShellCompDirectiveNoFileComp (argcomplete lists the files itself where a flag
        takes one). The candidates are argcomplete's, for the same command line."""
        import shlex

        typed = list(words) or [""]
        # The first word stands for the program and is skipped (`_ARGCOMPLETE=1`); one word.
        line = " ".join([shlex.quote(self.prog), *(shlex.quote(w) for w in typed[:-1]), typed[-1]])
        # argcomplete reads the command line from the environment, as its shell script sets it.
        request = {
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_IFS": "\n",
        }
        saved = {name: os.environ.get(name) for name in request}
        os.environ.update(request)
        answer = io.StringIO()
        try:
            _quiet_finder()(
                self.build_parser(prog),
                output_stream=answer,
                exit_method=lambda _code: None,
                append_space=False,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        candidates = [c for c in answer.getvalue().split("\n") if c]
        out.write("".join(f"{c}\n" for c in candidates) + ":4\n")
        return EXIT_OK


def _quiet_finder() -> Callable[..., None]:
    """argcomplete's finder, debugging to stderr. By default it wraps file descriptor 9 (the
    debug channel of its shell script) and closes it when done: in a process its script did not
    start, that is whatever else holds fd 9. argcomplete documents overriding this method."""
    from argcomplete import io as argcomplete_io
    from argcomplete.finders import CompletionFinder

    class QuietFinder(CompletionFinder):
        def _init_debug_stream(self) -> None:
            argcomplete_io.debug_stream = sys.stderr

    return QuietFinder()
