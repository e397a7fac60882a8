"""`mqbatch demo`: the README's main command (see mqbatch.scenarios.demo)."""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys

from mqbatch.scenarios.demo import MAX_SAMPLE_HZ, Demo, DemoError, DemoOptions
from mqbatch.util.argtypes import heap_size, non_negative_float, positive_float, positive_int
from mqbatch.util.procs import stop_signals_interrupt
from mqbatch.util.rundir import DirInUse, DirNotOurs


def run(args: argparse.Namespace) -> int:
    opts = DemoOptions(
        devices=args.devices,
        duration=args.duration,
        sample_hz=args.sample_hz,
        outage_s=args.outage_s,
        cut_s=args.cut_s,
        run_dir=pathlib.Path(args.run_dir),
        heapsize=args.heapsize,
        baseline=not args.no_baseline,
    )
    try:
        opts.check()  # every input, before anything starts (exit 2 like argparse)
    except DemoError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    stop = stop_signals_interrupt("demo")
    try:
        with stop:
            return Demo(opts).run()
    except DirNotOurs as e:  # --run-dir names a folder of the user's: an input error
        print(f"demo: {e}", file=sys.stderr)
        return 2
    except (DemoError, DirInUse) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        why = signal.Signals(stop.received).name if stop.received else "SIGINT"
        print(f"demo: interrupted ({why}); every process it started has been stopped", file=sys.stderr)
        return 128 + (stop.received or signal.SIGINT)


def register(sub) -> None:
    d = DemoOptions()
    p = sub.add_parser("demo", help="end-to-end demo: broker, virtual devices, recorder, Spark, report")
    p.add_argument("--devices", type=positive_int, default=d.devices, help=f"virtual devices (default {d.devices})")
    p.add_argument(
        "--duration", type=positive_float, default=d.duration, help=f"seconds of sampling (default {d.duration:g})"
    )
    p.add_argument(
        "--sample-hz",
        type=positive_float,
        default=d.sample_hz,
        help=f"samples per second per device (default {d.sample_hz:g}, at most {MAX_SAMPLE_HZ:g})",
    )
    p.add_argument(
        "--outage-s",
        type=non_negative_float,
        default=d.outage_s,
        help=f"length of the injected broker outage (default {d.outage_s:g}; 0: no outage)",
    )
    p.add_argument(
        "--cut-s",
        type=non_negative_float,
        default=d.cut_s,
        help=f"length of the injected network cut (default {d.cut_s:g}; 0: no cut)",
    )
    p.add_argument(
        "--run-dir",
        default=str(d.run_dir),
        help="working directory, wiped at start if an earlier demo made it (a folder of yours is refused)",
    )
    p.add_argument(
        "--heapsize",
        type=heap_size,
        default=d.heapsize,
        help=f"MicroPython heap per device (default {d.heapsize}; the firmware is measured to run in 64K, docs/application.md)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the per-record PUBLISH baseline")
    p.set_defaults(func=run)
