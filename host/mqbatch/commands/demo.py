"""`mqbatch demo`: the README's main command (see mqbatch.demo)."""
from __future__ import annotations

import argparse
import pathlib
import sys

from mqbatch.demo import Demo, DemoError, DemoOptions


def run(args: argparse.Namespace) -> int:
    opts = DemoOptions(devices=args.devices, duration=args.duration, sample_hz=args.sample_hz,
                       outage_s=args.outage_s, cut_s=args.cut_s, run_dir=pathlib.Path(args.run_dir),
                       heapsize=args.heapsize, baseline=not args.no_baseline)
    try:
        return Demo(opts).run()
    except DemoError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; every process it started has been stopped", file=sys.stderr)
        return 130


def register(sub) -> None:
    d = DemoOptions()
    p = sub.add_parser("demo", help="end-to-end demo: broker, virtual devices, recorder, Spark, report")
    p.add_argument("--devices", type=int, default=d.devices)
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of sampling")
    p.add_argument("--sample-hz", type=float, default=d.sample_hz)
    p.add_argument("--outage-s", type=float, default=d.outage_s, help="length of the injected broker outage")
    p.add_argument("--cut-s", type=float, default=d.cut_s, help="length of the injected network cut")
    p.add_argument("--run-dir", default=str(d.run_dir), help="working directory (wiped at start)")
    p.add_argument("--heapsize", default=d.heapsize,
                   help=f"MicroPython heap per device (default {d.heapsize}, the heap the firmware is measured in)")
    p.add_argument("--no-baseline", action="store_true", help="skip the per-record PUBLISH baseline")
    p.set_defaults(func=run)
