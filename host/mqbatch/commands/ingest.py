"""`mqbatch ingest`: the recorder. Lands every PUBLISH of a shared subscription
into a Parquet landing zone (docs/ingest.md) until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import os
import sys

from mqbatch.ingest.recorder import Recorder, RecorderConfig, RecorderConfigError, RecorderError
from mqbatch.util.argtypes import (
    directory,
    existing_file,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
)
from mqbatch.util.procs import SignalStop, on_stop_signals


def _config(args: argparse.Namespace) -> RecorderConfig:
    password = args.password
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            password = f.read().strip()
    elif password is None:
        password = os.environ.get("MQBATCH_PASSWORD")
    return RecorderConfig(
        host=args.host,
        port=args.port,
        landing=args.landing,
        client_id=args.client_id,
        group=args.group,
        topic_filter=args.filter,
        cafile=args.cafile,
        certfile=args.cert,
        keyfile=args.key,
        username=args.username,
        password=password,
        session_expiry=args.session_expiry,
        receive_maximum=args.receive_maximum,
        roll_bytes=args.roll_bytes,
        roll_seconds=args.roll_seconds,
        progress_seconds=args.progress_seconds,
        silence_warn_s=args.silence_warn_s,
        e2e_ack=args.e2e_ack,
        device_quota_bytes_per_s=args.device_quota_bytes_per_s,
        device_quota_burst_bytes=args.device_quota_burst_bytes,
    )


def run(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
        recorder = Recorder(cfg)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"ingest: error: {e}", file=sys.stderr)
        return 2
    # the line and the stop come from SignalStop's thread: Event.set() or a print in the
    # handler could deadlock or raise in the main thread (mqbatch.util.procs.SignalStop)
    stop = SignalStop(
        say=lambda name: print(f"ingest: {name}: closing the open landing file", file=sys.stderr, flush=True)
    )
    on_stop_signals(stop.handler)  # SIGINT, SIGTERM, SIGHUP
    try:
        return recorder.run(stop.event)
    except RecorderError as e:
        print(f"ingest: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, RecorderConfigError) else 1


def register(sub) -> None:
    p = sub.add_parser(
        "ingest", help="record MQTT PUBLISHes into a Parquet landing zone", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8883)
    p.add_argument("--landing", required=True, type=directory, help="landing zone directory")
    p.add_argument(
        "--client-id",
        default="mqbatch-recorder-1",
        help="MQTT client id, also the recorder id in landing file names (unique per recorder)",
    )
    p.add_argument("--group", default="mqbatch-recorders", help="shared-subscription group ($share/GROUP/FILTER)")
    p.add_argument("--filter", default="mqbatch/+/telemetry", help="topic filter (default mqbatch/+/telemetry)")
    p.add_argument("--cafile", help="CA certificate(s) that signed the broker's certificate (default: system CAs)")
    p.add_argument("--cert", help="client certificate (PEM)")
    p.add_argument("--key", help="client private key (PEM)")
    p.add_argument("--username")
    p.add_argument("--password", help="password (prefer --password-file or $MQBATCH_PASSWORD)")
    p.add_argument("--password-file", type=existing_file)
    p.add_argument(
        "--session-expiry",
        type=positive_int,
        default=3600,
        help="seconds the broker keeps the session and queued messages while the recorder is down",
    )
    p.add_argument("--receive-maximum", type=positive_int, default=100, help="PUBLISHes in flight towards the recorder")
    p.add_argument("--roll-bytes", type=positive_int, default=64 << 20, help="roll the landing file at this size")
    p.add_argument("--roll-seconds", type=positive_float, default=60.0, help="roll the landing file at this age")
    p.add_argument("--progress-seconds", type=positive_float, default=5.0, help="progress line interval")
    p.add_argument(
        "--silence-warn-s",
        type=non_negative_float,
        default=60.0,
        help="warn loudly when no PUBLISH arrived for this long (default 60; 0: never): the broker "
        "grants a subscription to topics the account may not read and then delivers nothing",
    )
    p.add_argument(
        "--no-e2e-ack",
        dest="e2e_ack",
        action="store_false",
        help="do not publish end-to-end acknowledgements to mqbatch/<device>/ack (docs/e2e-ack.md; "
        "default: on, for every landed batch with a valid batch-seq property)",
    )
    p.add_argument(
        "--device-quota-bytes-per-s",
        type=non_negative_int,
        default=1 << 20,
        help="payload bytes per second one device may land (token bucket; default 1 MiB/s; 0: no quota). "
        "Beyond it PUBLISHes are acknowledged but not landed, counted, and not acknowledged end to end",
    )
    p.add_argument(
        "--device-quota-burst-bytes",
        type=non_negative_int,
        default=64 << 20,
        help="bytes a device may send at once beyond its rate (default 64 MiB; 0 with a rate of 0)",
    )
    p.set_defaults(func=run)
