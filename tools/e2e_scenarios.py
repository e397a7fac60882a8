"""Issue 16's proof: run the end-to-end acknowledgement scenarios (mqbatch.scenarios.e2escenario)
and print, for each scenario and e2e on/off, records stored on the devices against
unique records landed + counted dropped, and what was LOST.

    .venv/bin/python tools/e2e_scenarios.py                                 # every scenario, virtual devices, on and off
    .venv/bin/python tools/e2e_scenarios.py --kind firmware --e2e off --scenario broker-kill-recorder-down
    .venv/bin/python tools/e2e_scenarios.py --devices 5 --seconds 60 --out run/e2e   # the long run
    # issue 22: the firmware at the demo's configuration, e2e on and off in the same run
    .venv/bin/python tools/e2e_scenarios.py --kind firmware --sample-hz 10 --scenario recorder-down \
        --outage-s 300 --seconds 360
    .venv/bin/python tools/e2e_scenarios.py --kind firmware --sample-hz 100 --scenario recorder-kills-10s --seconds 120
    sudo .venv/bin/python tools/e2e_scenarios.py --kind firmware --sample-hz 10 --devices 5 --scenario disk-full \
        --disk-full-s 60 --seconds 150 --spark-check  # root: the landing zone is a 32 MiB tmpfs of the run's own
    .venv/bin/python tools/e2e_scenarios.py --kind firmware --sample-hz 10 --devices 5 --scenario stream-kills \
        --seconds 240                             # needs Java (mqbatch spark --stream)

Virtual devices (paho-mqtt, docs/e2e-ack.md section 3) run e2e on and off; the
firmware (MicroPython Unix port) runs e2e off until firmware/ implements the
contract (then both). Exit status 1 if any e2e-on run lost a record or any run's own
checks (disk-full, stream-kills) found a problem; a scenario this machine cannot run
(disk-full without root) is reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from mqbatch.scenarios.diskfull import ScenarioUnavailable
from mqbatch.scenarios.e2escenario import SCENARIOS, run_scenario


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="run this scenario (repeatable; default: all)"
    )
    ap.add_argument("--kind", choices=("virtual", "firmware"), default="virtual")
    ap.add_argument("--e2e", choices=("on", "off", "both"), default="both")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the devices produce per run")
    ap.add_argument("--resend-after-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument(
        "--sample-hz",
        type=float,
        default=None,
        help="firmware only: run the demo's device configuration at this rate (default: the harness's 50 Hz)",
    )
    ap.add_argument("--outage-s", type=float, default=300.0, help="recorder-down: how long the recorder is down")
    ap.add_argument("--disk-full-s", type=float, default=60.0, help="disk-full: how long the landing disk is full")
    ap.add_argument(
        "--spark-check",
        action="store_true",
        help="after each run, `mqbatch spark` on its landing zone: report.json against records/ and what "
        "landed, every device's accounting balanced (needs Java)",
    )
    ap.add_argument("--out", type=pathlib.Path, default=None, help="keep each run's files here (default: a temp dir)")
    args = ap.parse_args(argv)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.e2e]
    results, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="mqbatch-e2e-") as tmp:
        base = args.out or pathlib.Path(tmp)
        for name in args.scenario or list(SCENARIOS):
            for e2e in modes:
                run_dir = base / f"{name}-{args.kind}-{'on' if e2e else 'off'}"
                try:
                    r = run_scenario(
                        name,
                        run_dir,
                        devices=args.devices,
                        kind=args.kind,
                        e2e=e2e,
                        run_for_s=args.seconds,
                        seed=args.seed,
                        resend_after_s=args.resend_after_s,
                        say=lambda text: print(text, flush=True),
                        sample_hz=args.sample_hz,
                        outage_s=args.outage_s,
                        disk_full_s=args.disk_full_s,
                        spark_check=args.spark_check,
                    )
                except ScenarioUnavailable as e:
                    skipped.append(f"{name}: skipped: {e}")
                    print(skipped[-1], flush=True)
                    continue
                print(r.line(), flush=True)
                results.append(r)
    print("\nsummary:")
    for r in results:
        print("  " + r.line())
    for line in skipped:
        print("  " + line)
    bad = [r for r in results if (r.e2e and r.lost) or r.problems]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
