"""`mqbatch deploy --port PORT --board esp32|rp2040|unix --config FILE [--config-only]`

The config is checked first with the firmware's own schema and rules (mqb_config.make_config in
the MicroPython Unix port): a config the board would refuse at boot is refused here.

    mqbatch deploy --board esp32 --print-template > my-device.json   # the board's config template
    mqbatch deploy --board esp32 --print-mip [--port PORT]            # mpremote mip lines (modules in /lib)
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

from mqbatch.fleet import deploy
from mqbatch.util.paths import BOARDS, MIP_PACKAGE, ROOT

WIFI_BOARDS = ("esp32", "rp2040")  # they also need boards/common (mqb_wifi)


def mip_commands(board: str, port: str | None) -> list[str]:
    """The mpremote lines that install the firmware modules and the board module into /lib,
    from this installation's own package.json files (a checkout's or the wheel's)."""
    packages = [MIP_PACKAGE] + [BOARDS / "common" / "package.json"] * (board in WIFI_BOARDS)
    packages.append(BOARDS / board / "package.json")
    return [shlex.join(["mpremote", "connect", port or "PORT", "mip", "install", str(p)]) for p in packages]


def run(args: argparse.Namespace) -> int:
    if args.print_template:
        sys.stdout.write((BOARDS / args.board / "config.template.json").read_text(encoding="utf-8"))
        return 0
    if args.print_mip:
        print("\n".join(mip_commands(args.board, args.port)))
        return 0
    missing = [f for f, v in (("--port", args.port), ("--config", args.config)) if not v]
    if missing:
        print(f"mqbatch deploy: {' and '.join(missing)} required (or --print-template / --print-mip)", file=sys.stderr)
        return 2
    build_dir = pathlib.Path(args.build_dir or ROOT / "build" / args.board)
    try:
        plan = deploy.build(args.board, pathlib.Path(args.config), build_dir, config_only=args.config_only)
        deploy.deploy(plan, args.port, reset=not args.no_reset, force=args.force)
    except deploy.DeployError as e:
        print(f"mqbatch deploy: {e}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "deploy",
        help="compile the firmware with mpy-cross and copy it to a board with mpremote",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--port", help="serial port of the board (a pty for a virtual unix board); required to deploy")
    p.add_argument("--board", required=True, choices=deploy.BOARD_NAMES)
    p.add_argument(
        "--config",
        help="device config JSON; required to deploy (start from `mqbatch deploy --board BOARD --print-template`, "
        "or `mqbatch fleet add`)",
    )
    p.add_argument("--build-dir", help="where to put compiled files (default build/BOARD)")
    p.add_argument("--no-reset", action="store_true", help="do not reset the board after verifying")
    p.add_argument(
        "--force",
        action="store_true",
        help="deploy even when the board's free heap is below what the config needs (a warning instead of "
        "the refusal; docs/application.md 'Heap check')",
    )
    p.add_argument(
        "--config-only",
        action="store_true",
        help="the modules are frozen in the board's image or in /lib (mip): copy only main.py, the config "
        "and its certificate files, and remove module files in the flash root that would shadow them",
    )
    for flag, what in (
        ("--print-template", "print the board's config template (JSON) and exit"),
        (
            "--print-mip",
            "print the `mpremote mip install` lines that put the firmware and board modules in /lib "
            "(this installation's package.json files), then deploy with --config-only",
        ),
    ):
        p.add_argument(flag, action="store_true", help=what)
    p.set_defaults(func=run)
