"""`mqbatch deploy --port PORT --board esp32|rp2040|unix --config FILE [--config-only]`

The config is checked first with the firmware's own rules (mqb_app.make_config in
the MicroPython Unix port): a config the board would refuse at boot is refused here."""

from __future__ import annotations

import argparse
import pathlib
import sys

from mqbatch.fleet import deploy
from mqbatch.util.paths import ROOT


def run(args: argparse.Namespace) -> int:
    build_dir = pathlib.Path(args.build_dir or ROOT / "build" / args.board)
    try:
        plan = deploy.build(args.board, pathlib.Path(args.config), build_dir, config_only=args.config_only)
        deploy.deploy(plan, args.port, reset=not args.no_reset)
    except deploy.DeployError as e:
        print(f"mqbatch deploy: {e}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser("deploy", help="compile the firmware with mpy-cross and copy it to a board with mpremote")
    p.add_argument("--port", required=True, help="serial port of the board (a pty for a virtual unix board)")
    p.add_argument("--board", required=True, choices=deploy.BOARD_NAMES)
    p.add_argument("--config", required=True, help="device config JSON (from boards/BOARD/config.template.json)")
    p.add_argument("--build-dir", help="where to put compiled files (default build/BOARD)")
    p.add_argument("--no-reset", action="store_true", help="do not reset the board after verifying")
    p.add_argument(
        "--config-only",
        action="store_true",
        help="the modules are frozen in the board's image or in /lib (mip): copy only main.py, the config "
        "and its certificate files, and remove module files in the flash root that would shadow them",
    )
    p.set_defaults(func=run)
