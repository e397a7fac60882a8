"""`mqbatch bench latency`: time to table, record sampled on a device -> row readable in
records/, in streaming mode (the recorder `mqbatch ingest` + `mqbatch spark --stream`).

Default: the `bench fleet` machinery (mqbatch.bench.fleet) at 10 simulated devices,
10 records/s each, batches of 20 (a batch leaves at 2 s of age), 2 minutes, with the
recorder's and the streaming job's own defaults (--roll-seconds 60, --trigger-seconds 10)
unless given. records/ is polled every 0.5 s with pyarrow; each row is matched by (device,
boot, seq) to the sampling time its device recorded. Two figures, labelled apart:

  time to table            sampled -> readable in records/ (what a user of the table waits);
  device -> recorder       received_at - device time (the recorder got the PUBLISH; the row
                           is not in any table yet): the figure this bench printed before.

`--outage`: the former measurement, device -> recorder receive only, at 10 virtual devices
(the firmware in the MicroPython Unix port, the demo's machinery, then the batch Spark job),
in steady state and after a broker outage:

  steady state    from 5 s after the start to 3 s before the outage (a batch leaves at
                  2 s of age at the latest, so these were delivered before it began);
  after outage    from 3 s before the outage to 10 s after its end: batches the outage
                  caught, which waited in the device's outbox on flash, then drained;
  recovered       later than that.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

WARMUP_S = 5.0
BEFORE_S = 3.0  # the demo's flush max_age_ms (2 s) + 1 s
AFTER_S = 10.0


def percentiles(values: list[float]) -> dict:
    import numpy as np

    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    return {
        "n": len(values),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def phases(device_s: list[float], latency_ms: list[float], outage: tuple[float, float]) -> dict:
    """Latency percentiles per phase; device_s: each record's sampling time in s since the start."""
    start, end = outage
    split = {"steady state": [], "after outage": [], "recovered": []}
    for t, lat in zip(device_s, latency_ms):
        if t is None or lat is None or t < WARMUP_S:
            continue
        key = "steady state" if t < start - BEFORE_S else "after outage" if t < end + AFTER_S else "recovered"
        split[key].append(lat)
    return {k: percentiles(v) for k, v in split.items()}


def bench_latency(args: argparse.Namespace) -> int:
    return bench_outage(args) if args.outage else bench_table(args)


def fleet_args(args: argparse.Namespace) -> argparse.Namespace:
    """`bench fleet`'s arguments for this run: its defaults (every option run_fleet reads,
    also those added later), then this bench's settings."""
    from mqbatch.bench import fleet

    parser = argparse.ArgumentParser(add_help=False)
    fleet.add_arguments(parser)
    fargs = parser.parse_args([])
    fargs.__dict__.update(
        devices=2 if args.quick else args.devices,
        rate=args.sample_hz,
        batch=args.batch,
        minutes=0.3 if args.quick else args.minutes,
        workers=1,
        roll_seconds=args.roll_seconds,
        trigger_seconds=args.trigger_seconds,
        report_seconds=args.report_seconds,
        ramp_s=2.0,
        progress_s=15.0,
        out=args.out,
    )
    return fargs


def bench_table(args: argparse.Namespace) -> int:
    from mqbatch.bench import fleet
    from mqbatch.bench.out import write_result

    fargs = fleet_args(args)
    devices, minutes = fargs.devices, fargs.minutes
    print(
        f"latency bench: time to table in streaming mode, {devices} simulated devices x {args.sample_hz:g} "
        f"records/s, batches of {args.batch}, {minutes:g} min, recorder --roll-seconds {args.roll_seconds:g}, "
        f"spark --stream --trigger-seconds {args.trigger_seconds} --report-seconds {args.report_seconds}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-latency-") as t:
        fargs.run_dir = t
        fig = fleet.run_fleet(fargs, say=lambda s: print(s, flush=True))
    for line in fleet.report_lines(fig):
        print(line)
    if fig["lost"]:
        print(f"latency bench: {fig['lost']:,} records lost", file=sys.stderr)
    write_result(args, "latency", {"mode": "stream", **fig})
    return 1 if fig["lost"] else 0


def bench_outage(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    from mqbatch.bench.out import write_result
    from mqbatch.report import html as htmlreport
    from mqbatch.scenarios.demo import Demo, DemoOptions

    devices, duration, outage_s = (2, 24, 3) if args.quick else (args.devices, args.duration, args.outage_s)
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-latency-") as t:
        run_dir = pathlib.Path(t) / "demo"
        log_path = pathlib.Path(t) / "demo.log"
        opts = DemoOptions(
            devices=devices,
            duration=duration,
            sample_hz=args.sample_hz,
            outage_at=duration / 2,
            outage_s=outage_s,
            cut_s=0,
            run_dir=run_dir,
            baseline=False,
        )
        print(
            f"latency bench: {devices} virtual devices, {duration:g} s at {args.sample_hz:g} Hz, broker outage of "
            f"{outage_s:g} s at {duration / 2:g} s; the demo's machinery (progress in a log)",
            flush=True,
        )
        with open(log_path, "w") as log:
            demo = Demo(opts, out=log)
            try:
                code = demo.run()
            except Exception:
                print(log_path.read_text()[-3000:], file=sys.stderr)
                raise
        if code != 0:
            print(log_path.read_text()[-3000:], file=sys.stderr)
            print("latency bench: the demo lost records (see above)", file=sys.stderr)
            return 1
        windows = [(s, e) for s, e, label in demo.fault_windows if label == "broker outage"]
        if not windows:
            raise RuntimeError("the broker outage was not injected")
        recs = htmlreport.read_records(run_dir / "spark-out" / "records")
        us = pc.cast(pc.cast(recs["device_time"], pa.timestamp("us")), pa.int64()).to_pylist()
        device_s = [None if v is None else v / 1e6 - demo.run_start_wall for v in us]
        figures = phases(device_s, recs["latency_ms"].to_pylist(), windows[0])
    print(
        f"broker outage {windows[0][0]:.1f}-{windows[0][1]:.1f} s after the devices started; "
        f"records by sampling time (first {WARMUP_S:g} s left out){' (--quick: a smoke test)' if args.quick else ''}:"
    )
    for name, f in figures.items():
        if f["n"]:
            print(
                f"  {name:13} latency p50 {f['p50']:,.0f} ms, p99 {f['p99']:,.0f} ms, max {f['max']:,.0f} ms "
                f"({f['n']:,} records)"
            )
        else:
            print(f"  {name:13} no records")
    write_result(
        args,
        "latency",
        {
            "devices": devices,
            "duration_s": duration,
            "sample_hz": args.sample_hz,
            "outage": list(windows[0]),
            "warmup_s": WARMUP_S,
            "before_s": BEFORE_S,
            "after_s": AFTER_S,
            "flush": "100 records, 2,048 B or 2 s",
            "mode": "outage",
            "phases": figures,
        },
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", type=int, default=10, help="devices (default 10)")
    p.add_argument("--sample-hz", type=float, default=10, help="samples per second per device (default 10)")
    p.add_argument("--minutes", type=float, default=2.0, help="minutes of sampling (default 2)")
    p.add_argument("--batch", type=int, default=20, help="records per PUBLISH (default 20: 2 s at 10 Hz)")
    p.add_argument("--roll-seconds", type=float, default=60.0, help="recorder --roll-seconds (default 60, its default)")
    p.add_argument("--trigger-seconds", type=int, default=10, help="spark --trigger-seconds (default 10, its default)")
    p.add_argument(
        "--report-seconds",
        type=int,
        default=0,
        help="spark --report-seconds: report.json at most this often (default 0, its default: every micro-batch)",
    )
    p.add_argument(
        "--outage",
        action="store_true",
        help="the former figure instead: device -> recorder receive only, firmware devices, a broker outage",
    )
    p.add_argument("--duration", type=float, default=60, help="--outage: seconds of sampling (default 60)")
    p.add_argument("--outage-s", type=float, default=8, help="--outage: broker outage half-way (default 8 s)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 2 devices, 18 s (--outage: 24 s, 3 s outage)")
