"""The `mqbatch` command. Each subcommand lives in its own module with a
`register(subparsers)` function; this file only wires them together.

Subcommands are imported lazily: `mqbatch NAME ...` imports only
mqbatch.commands.NAME, so one command's dependencies (pyspark for `spark`,
paho-mqtt for `ingest`) never break another. `mqbatch --help` imports them all
and lists one that cannot be imported with the reason."""

from __future__ import annotations

import argparse
import importlib
import sys

from mqbatch import version

# module names under mqbatch.commands, one per subcommand
COMMANDS = [
    "bench",
    "conformance",
    "decode",
    "demo",
    "deploy",
    "devices",
    "fleet",
    "ingest",
    "report",
    "spark",
    "vboard",
]


def _unavailable(name: str, error: Exception):
    def run(args):
        print(f"mqbatch {name}: unavailable, it cannot be imported: {error}", file=sys.stderr)
        return 1

    return run


def _register(sub, name: str) -> None:
    try:
        importlib.import_module(f"mqbatch.commands.{name}").register(sub)
    except ImportError as e:  # at import, or in register() (options shared with a job file)
        # drop what a register() that failed half-way added, then say why the command is unavailable
        sub.choices.pop(name, None)
        sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest != name]
        p = sub.add_parser(name, help=f"(unavailable: {e})", add_help=False)
        p.set_defaults(func=_unavailable(name, e), unavailable=True)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with argv naming a command, only that command's module is imported."""
    parser = argparse.ArgumentParser(prog="mqbatch", description="MQTT 5 batch telemetry: decode, ingest, analyse.")
    parser.add_argument("--version", action="version", version=f"mqbatch {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    first = next((a for a in (argv or []) if not a.startswith("-")), None)
    if first in COMMANDS:
        names = [first]
    elif first is None and "--version" in (argv or []):
        names = []
    else:
        names = COMMANDS
    for name in names:
        _register(sub, name)
    return parser


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command `args` ran (`fleet add` for `mqbatch fleet add ...`):
    its usage line is the one to show with an error about that command's arguments."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "unavailable", False):  # an unavailable command takes any arguments
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
