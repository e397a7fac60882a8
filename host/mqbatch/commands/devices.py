"""`mqbatch devices`: run N virtual devices (the real firmware in the MicroPython
Unix port, board `unix`), each with its own identity, credentials and flash.

Without --broker it starts a local secured stack first (TLS, passwords,
per-device ACLs; see mqbatch.stack) and stops it at the end."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from mqbatch.devices import DeviceError, Fleet, device_ids
from mqbatch.paths import ROOT


def run(args: argparse.Namespace) -> int:
    run_dir = pathlib.Path(args.dir)
    ids = device_ids(args.count)
    config = {"sample_hz": args.sample_hz, "run_for_s": args.duration, "drain_timeout_s": args.drain_timeout}
    stack = None
    if args.broker:
        host, _, port = args.broker.rpartition(":")
        if not args.credentials:
            print("devices: --broker needs --credentials (JSON {device: password})", file=sys.stderr)
            return 2
        creds = json.loads(pathlib.Path(args.credentials).read_text())
        missing = [d for d in ids if d not in creds]
        if missing:
            print(f"devices: --credentials has no password for {', '.join(missing)}", file=sys.stderr)
            return 2
        creds = {d: creds[d] for d in ids}
        ca = args.ca
    else:
        from mqbatch.stack import LocalStack
        stack = LocalStack(run_dir / "stack", ids)
        stack.broker.start()
        host, port, creds, ca = stack.broker.host, stack.broker.port, stack.credentials, stack.ca_cert
        print(f"devices: local broker {stack.broker.url} (TLS, auth, per-device ACL)")
    try:
        with Fleet(run_dir / "devices", host, int(port), credentials=creds, ca=ca, tls=not args.plain,
                   heapsize=None if args.heapsize.lower() == "none" else args.heapsize, config=config) as fleet:
            fleet.start()
            t0 = time.monotonic()
            last = [0.0]

            def progress(f):
                if time.monotonic() - last[0] >= 5:
                    last[0] = time.monotonic()
                    print(f"devices: {time.monotonic() - t0:5.0f} s, {len(f.running())} running, "
                          f"{len(f.stored())} records stored", flush=True)

            codes = fleet.wait(args.duration + args.drain_timeout + 60, progress)
            sums = fleet.summaries()
            for dev in ids:
                s = sums.get(dev)
                if s is None:
                    print(f"{dev}: exit {codes[dev]}, no summary; console tail:\n{fleet.console(dev)[-800:]}")
                else:
                    print(f"{dev}: exit {codes[dev]}, boot {s['boot']}, sampled {s['sampled']}, "
                          f"acked {s['acked_records']}/{s['stored_records']}, outbox {s['outbox_depth']}, "
                          f"dropped {s['dropped_total']}, reconnects {s['reconnects']}")
            ok = all(codes[d] == 0 and d in sums and not sums[d]["outbox_depth"] for d in ids)
            if not ok:
                print("devices: not every device finished with an empty outbox (see above)", file=sys.stderr)
            return 0 if ok else 1
    except DeviceError as e:
        print(f"devices: {e}", file=sys.stderr)
        return 1
    finally:
        if stack:
            stack.broker.stop()


def register(sub) -> None:
    p = sub.add_parser("devices", help="run N virtual devices (firmware in the MicroPython Unix port)",
                       description=__doc__)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--duration", type=float, default=60, help="seconds of sampling per device")
    p.add_argument("--drain-timeout", type=float, default=60, help="seconds to empty the outbox after sampling")
    p.add_argument("--sample-hz", type=float, default=10)
    p.add_argument("--dir", default=str(ROOT / "run" / "devices"), help="run directory (flash of each device)")
    p.add_argument("--broker", help="HOST:PORT of an existing broker (default: start a local secured one)")
    p.add_argument("--credentials", help="JSON file {device id: password} (with --broker)")
    p.add_argument("--ca", help="CA certificate of the broker (with --broker)")
    p.add_argument("--plain", action="store_true", help="plain TCP (development only)")
    p.add_argument("--heapsize", default="64K",
                   help="MicroPython heap per device (default: 64K; 'none': the port's own default)")
    p.set_defaults(func=run)
