"""The `mqbatch` command. Each subcommand lives in its own module with a
`register(subparsers)` function; this file only wires them together."""
from __future__ import annotations

import argparse
import importlib
import sys

# module names under mqbatch.commands, one per subcommand
COMMANDS = ["decode", "demo", "deploy", "devices", "fleet", "ingest", "spark"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqbatch", description="MQTT 5 batch telemetry: decode, ingest, analyse.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"mqbatch.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
