"""Soak the device application in a 64 KB MicroPython heap (docs/application.md, Memory).

One virtual device (mqbatch.lab.devices.Fleet: the firmware as .mpy in a ROMFS image
mapped outside the heap, `micropython -X heapsize=...`) samples at 10 Hz over TLS
to a local Mosquitto (mqbatch.lab.stack.LocalStack) through a relay
(mqbatch.scenarios.netcut.Relay), for --duration seconds, with one broker outage (broker
stopped, then started again) and one network cut (the relay drops every
connection and refuses new ones). A paho-mqtt subscriber with a persistent
session (Clean Start 0) is the witness of what arrived. Prints the figures and
exits 1 if the device failed, hit a MemoryError, or a stored record was lost.

    .venv/bin/python tools/soak_app.py                  # 600 s, the figures of docs/application.md
    .venv/bin/python tools/soak_app.py --duration 60 --outage-at 20 --outage-s 15 --cut-at 45 --cut-s 5
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the reference subscriber of the tests

from mqbatch.lab.stack import RECORDER_CLIENT_ID, LocalStack  # noqa: E402
from mqbatch.scenarios.netcut import Relay  # noqa: E402
from mqbatch.wire import (
    codec,
    records,  # noqa: E402
)
from mqbatch_testing.broker import Subscriber  # noqa: E402

DEV = "dev-001"


def delivered(payloads):
    """(boot, seq) of each record delivered, the number of duplicates, and the free_heap of each health record."""
    seen, dups, free = set(), 0, []
    for m in payloads:
        if not m.topic.endswith("/telemetry"):
            continue
        res = codec.decode(m.user_properties, m.payload, topic=m.topic)
        if res.status != codec.OK:
            raise RuntimeError(f"undecodable batch: {res.log}")
        for sub in res.messages:
            rec = records.parse(sub)
            key = (rec.boot, rec.seq)
            if key in seen:
                dups += 1
            seen.add(key)
            if rec.kind == records.HEALTH:
                free.append(rec.value(0x80))
    return seen, dups, free


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=600, help="seconds of sampling (default 600)")
    ap.add_argument("--heapsize", default="64K")
    ap.add_argument("--sample-hz", type=int, default=10)
    ap.add_argument("--outage-at", type=float, default=120, help="broker stopped at this second")
    ap.add_argument("--outage-s", type=float, default=45, help="for this long")
    ap.add_argument("--cut-at", type=float, default=360, help="network cut (relay) at this second; < 0: none")
    ap.add_argument("--cut-s", type=float, default=20)
    ap.add_argument("--run-dir", default=None, help="kept after the run (default: a temporary directory)")
    a = ap.parse_args(argv)

    run_dir = pathlib.Path(a.run_dir or tempfile.mkdtemp(prefix="mqb-soak-"))
    stack = LocalStack(run_dir, [DEV])
    broker = stack.broker
    broker.start()
    relay = Relay(broker.host, broker.port).start()
    # the witness uses the recorder's account: the broker binds it to the recorder's client id
    # and lets it subscribe only the recorders' share group (docs/security.md)
    witness = Subscriber(
        broker,
        stack.policy.share_subscription,
        client_id=RECORDER_CLIENT_ID,
        username=stack.recorder_login[0],
        password=stack.recorder_login[1],
        cafile=stack.ca_cert,
        persistent=True,
    )
    cfg = {
        "sample_hz": a.sample_hz,
        "run_for_s": a.duration,
        "drain_timeout_s": 120,
        "health_every_s": 10,
        "backoff": {"initial_ms": 500, "max_ms": 5000},
    }
    fleet = stack.fleet(run_dir / "fleet", relay.host, relay.port, signed=False, heapsize=a.heapsize, config=cfg)
    events = sorted(
        [(a.outage_at, "broker stop"), (a.outage_at + a.outage_s, "broker start")]
        + ([(a.cut_at, "cut"), (a.cut_at + a.cut_s, "restore")] if a.cut_at >= 0 else [])
    )
    print(f"soak: {a.duration} s at {a.sample_hz} Hz, heapsize {a.heapsize}, TLS, events {events}; {run_dir}")
    t0 = time.monotonic()
    try:
        fleet.start()
        for at, what in events:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if what == "broker stop":
                broker.stop()
            elif what == "broker start":
                broker.start()
            elif what == "cut":
                relay.cut()
            else:
                relay.restore()
            print(f"  t={time.monotonic() - t0:6.1f} s  {what}", flush=True)
        codes = fleet.wait(a.duration + 300)
    finally:
        fleet.stop()
    payloads = witness.settle(quiet=2.0, timeout=60)
    witness.close()
    relay.stop()
    broker.stop()

    console = fleet.console(DEV)
    summary = fleet.summaries().get(DEV, {})
    stored = {(b, s) for _, b, s in fleet.stored()}
    got, dups, free = delivered(payloads)
    lost = stored - got
    memory_errors = console.count("MemoryError")
    print(json.dumps(summary, indent=1))
    print(f"exit code            {codes.get(DEV)}")
    print(f"MemoryError lines    {memory_errors}")
    print(f"records stored       {len(stored)}")
    print(f"records delivered    {len(stored & got)} (duplicates {dups})")
    print(f"records lost         {len(lost)}")
    print(f"reconnects           {summary.get('reconnects')}")
    print(
        f"peak_heap_live       {summary.get('peak_heap_live')} B  (after gc.collect(), per health record and connect)"
    )
    print(
        f"peak_heap            {summary.get('peak_heap')} B  (highest gc.mem_alloc() after a step's network work, incl. garbage)"
    )
    if free:
        print(
            f"free_heap (health)   min {min(free)}  median {statistics.median(free):.0f}  max {max(free)} B "
            f"over {len(free)} health records"
        )
    ok = codes.get(DEV) == 0 and not memory_errors and stored and not lost
    if not ok:
        print(console[-3000:])
    if a.run_dir is None and ok:
        shutil.rmtree(run_dir, ignore_errors=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
