"""`mqbatch devices`: run N virtual devices (the real firmware in the MicroPython
Unix port, board `unix`), each with its own identity, credentials and flash.

Without --broker it starts a local secured stack first (TLS, passwords,
per-device ACLs; see mqbatch.lab.stack) and stops it at the end."""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys

from mqbatch.lab.devices import DEFAULT_HEAP, MAX_SAMPLE_HZ, DeviceError, Fleet, device_ids, progress_lines
from mqbatch.util.argtypes import (
    existing_file,
    heap_size,
    host_port,
    non_negative_float,
    positive_float,
    positive_int,
    read_json_object,
)
from mqbatch.util.paths import ROOT
from mqbatch.util.procs import log_tail, stop_signals_interrupt
from mqbatch.util.rundir import DirInUse, DirNotOurs, claim_dir

RUN_DIR_ENTRIES = frozenset({"stack", "devices"})  # what a run before the rundir marker wrote


def _existing_broker(args: argparse.Namespace, ids: list[str]) -> dict:
    """{device: password} for --broker, checked: ValueError with a sentence naming the flag."""
    if not args.credentials:
        raise ValueError("--broker needs --credentials FILE (JSON object {device id: password})")
    if not args.plain and not args.ca:
        raise ValueError(
            "--broker uses TLS: give --ca FILE (the CA certificate that signed the broker's), "
            "or --plain for a plain-TCP development broker"
        )
    if args.ca and not pathlib.Path(args.ca).is_file():
        raise ValueError(f"--ca {args.ca}: no such file")
    creds = read_json_object(args.credentials, "--credentials")
    missing = [d for d in ids if d not in creds]
    if missing:
        raise ValueError(f"--credentials has no password for {', '.join(missing)}")
    bad = [d for d in ids if not isinstance(creds[d], str)]
    if bad:
        raise ValueError(f"--credentials: the password of {', '.join(bad)} must be a JSON string")
    return {d: creds[d] for d in ids}


def run(args: argparse.Namespace) -> int:
    if args.sample_hz > MAX_SAMPLE_HZ:
        print(
            f"devices: --sample-hz must be at most {MAX_SAMPLE_HZ:g} (the firmware's limit), got {args.sample_hz:g}",
            file=sys.stderr,
        )
        return 2
    ids = device_ids(args.count)
    if args.broker:
        try:
            creds = _existing_broker(args, ids)
        except ValueError as e:
            print(f"devices: {e}", file=sys.stderr)
            return 2
    stop = stop_signals_interrupt("devices")
    try:
        with stop, claim_dir(pathlib.Path(args.dir), "mqbatch devices", "--dir", RUN_DIR_ENTRIES):
            return _run(args, ids, creds if args.broker else None)
    except DirNotOurs as e:  # like `demo --run-dir`: a folder of the user's is refused, untouched
        print(f"devices: {e}", file=sys.stderr)
        return 2
    except DirInUse as e:
        print(f"devices: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sig = stop.received or signal.SIGINT
        print(
            f"devices: interrupted ({signal.Signals(sig).name}); every device and broker it started has been stopped",
            file=sys.stderr,
        )
        return 128 + sig


def _run(args: argparse.Namespace, ids: list[str], creds: dict | None) -> int:
    run_dir = pathlib.Path(args.dir)
    stack = hmac_keys = None
    try:
        if args.broker:
            (host, port), ca = args.broker, args.ca
        else:
            from mqbatch.lab.stack import LocalStack

            stack = LocalStack(run_dir / "stack", ids)
            stack.broker.start()
            host, port, creds, ca = stack.broker.host, stack.broker.port, stack.credentials, stack.ca_cert
            hmac_keys = stack.hmac_keys
            print(
                f"devices: each device signs its batches; the Spark job's --hmac-keys file: {stack.hmac_keys_file}",
                flush=True,
            )
            print(f"devices: local broker {stack.broker.url} (TLS, auth, per-device ACL)", flush=True)
        return _run_fleet(args, ids, run_dir, host, port, creds, ca, hmac_keys)
    finally:
        if stack:
            stack.broker.stop()


def _run_fleet(args, ids, run_dir, host, port, creds, ca, hmac_keys=None) -> int:
    config = {"sample_hz": args.sample_hz, "run_for_s": args.duration, "drain_timeout_s": args.drain_timeout}
    try:
        with Fleet(
            run_dir / "devices",
            host,
            int(port),
            credentials=creds,
            ca=ca,
            tls=not args.plain,
            heapsize=args.heapsize,
            config=config,
            hmac_keys=hmac_keys,
        ) as fleet:
            fleet.start()
            progress = progress_lines("devices", every_s=5, run_for_s=args.duration)
            codes = fleet.wait(args.duration + args.drain_timeout + 60, progress)
            sums = fleet.summaries()
            for dev in ids:
                s = sums.get(dev)
                if s is None:
                    print(
                        f"{dev}: exit {codes[dev]}, no summary; its console:\n"
                        + log_tail(fleet.dir(dev) / "console.log")
                    )
                else:
                    print(
                        f"{dev}: exit {codes[dev]}, boot {s['boot']}, sampled {s['sampled']}, "
                        f"acked {s['acked_records']}/{s['stored_records']}, outbox {s['outbox_depth']}, "
                        f"dropped {s['dropped_total']}, reconnects {s['reconnects']}"
                    )
            ok = all(codes[d] == 0 and d in sums and not sums[d]["outbox_depth"] for d in ids)
            if not ok:
                print("devices: not every device finished with an empty outbox (see above)", file=sys.stderr)
            return 0 if ok else 1
    except DeviceError as e:
        print(f"devices: {e}", file=sys.stderr)
        return 1


def register(sub) -> None:
    p = sub.add_parser(
        "devices", help="run N virtual devices (firmware in the MicroPython Unix port)", description=__doc__
    )
    p.add_argument("--count", type=positive_int, default=5, help="number of devices (default 5)")
    p.add_argument("--duration", type=positive_float, default=60, help="seconds of sampling per device")
    p.add_argument(
        "--drain-timeout", type=non_negative_float, default=60, help="seconds to empty the outbox after sampling"
    )
    p.add_argument(
        "--sample-hz",
        type=positive_float,
        default=10,
        help=f"samples per second per device (default 10, at most {MAX_SAMPLE_HZ:g})",
    )
    p.add_argument(
        "--dir",
        default=str(ROOT / "run" / "devices"),
        help="run directory (flash of each device), wiped at start if an earlier run made it "
        "(a folder of yours is refused); locked while in use",
    )
    p.add_argument(
        "--broker", type=host_port, metavar="HOST:PORT", help="an existing broker (default: start a local secured one)"
    )
    p.add_argument("--credentials", help="JSON file {device id: password} (with --broker)")
    p.add_argument("--ca", type=existing_file, help="CA certificate of the broker (with --broker)")
    p.add_argument("--plain", action="store_true", help="plain TCP (development only)")
    p.add_argument(
        "--heapsize",
        type=heap_size,
        default=DEFAULT_HEAP,
        help=f"MicroPython heap per device (default: {DEFAULT_HEAP}; the firmware is measured to run in 64K, "
        "docs/application.md; 'none': the port's own default)",
    )
    p.set_defaults(func=run)
