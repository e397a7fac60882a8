"""`mqbatch bench TARGET`: benchmarks that print figures (median [min-max] of repeated
runs, ratios measured in the same run). Targets:

  wire    bytes per record on the wire, records/s and heap per record vs batch size,
          against umqtt.simple and a JSON array (mqbatch/bench/wire.py)
  spark   records/s of the Spark pipeline on a generated landing zone (docs/spark.md)
  device  the device hot path in the MicroPython Unix port (mqbatch/bench/device.py)
  ingest  the recorder's PUBLISH/s and peak RSS against a counting subscriber (docs/ingest.md)
  latency time to table: record sampled -> row readable in records/ in streaming mode,
          p50/p99, and device -> recorder receive apart (mqbatch/bench/latency.py;
          --outage: the former demo/outage figure)
  fleet   N simulated devices (TLS, e2e acks) -> broker -> recorder -> streaming job:
          records lost (must be 0), time to table, recorder/broker cost, a PNG
          (mqbatch/bench/fleet.py; docs/scale.md)
  e2e-cost wire bytes end-to-end acks add per batch and record (mqbatch/bench/e2ecost.py)
  resend  one streaming micro-batch over a history, with and without a resent PUBLISH
          (mqbatch/bench/resend.py; docs/scale.md)
  all     the five above in turn (`--quick`: smoke-test sizes, without latency), then
          `report`; `make bench` runs it
  report  docs/benchmarks.md and its PNG plots from the results in run/bench/

Every target writes its figures, the machine, the versions and the exact command
to run/bench/TARGET.json (--out DIR elsewhere). `bench all` renders them into
docs/benchmarks.md with plots in docs/benchmarks/ (mqbatch/bench/report.py);
`bench all --quick` renders into run/bench/ instead and never overwrites docs/.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from mqbatch.bench import device as bench_device
from mqbatch.bench import out as bench_out


def bench_spark(args: argparse.Namespace) -> int:
    from mqbatch.bench.spark import bench_spark as run_spark

    return run_spark(args)


def bench_ingest(args: argparse.Namespace) -> int:
    from mqbatch.bench.ingest import bench_ingest as run_ingest

    return run_ingest(args)


# `bench all`: every target in turn, each with its own defaults (or its smoke-test size with --quick)
# (latency runs the demo and a Spark job, minutes: not in --quick)
ALL = (
    ("wire", ["--quick"]),
    ("device", ["--quick"]),
    ("ingest", ["--quick"]),
    ("spark", ["--records", "5000", "--repeat", "1", "--warmup", "0"]),
    ("latency", None),
)


def bench_all(args: argparse.Namespace) -> int:
    failed = []
    for name, quick in ALL:
        if quick is None and args.quick:
            print(f"(mqbatch bench {name} is not part of --quick: it takes minutes)", flush=True)
            continue
        argv = ["bench", name] + (quick if args.quick else []) + ["--out", str(args.out)]
        print(f"== mqbatch bench {name} {' '.join(quick) if args.quick else ''}".rstrip(), flush=True)
        bench_out.command_override = f"mqbatch {' '.join(argv[:-2])} (part of: {bench_out.command()})"
        bench_out.quick_override = args.quick
        try:
            if run(_parse(argv)) != 0:
                failed.append(name)
        finally:
            bench_out.command_override, bench_out.quick_override = None, False
    if failed:
        print(f"bench all: {', '.join(failed)} failed", file=sys.stderr)
    print("== mqbatch bench report", flush=True)
    bench_report(args)
    return 1 if failed else 0


def _parse(argv: list[str]) -> argparse.Namespace:
    """`mqbatch ARGV` for a bench target, parsed by this module's own parser."""
    parser = argparse.ArgumentParser(prog="mqbatch")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def bench_report(args: argparse.Namespace) -> int:
    from mqbatch.bench.report import render

    docs = args.docs or (args.out if args.quick else pathlib.Path("docs"))
    md = render(args.out, docs)
    print(f"report: {md} (plots in {md.parent / 'benchmarks'})")
    return 0


def bench_wire(args: argparse.Namespace) -> int:
    from mqbatch.bench.wire import bench_wire as run_wire

    return run_wire(args)


def bench_latency(args: argparse.Namespace) -> int:
    from mqbatch.bench.latency import bench_latency as run_latency

    return run_latency(args)


def bench_fleet(args: argparse.Namespace) -> int:
    from mqbatch.bench.fleet import bench_fleet as run_fleet

    return run_fleet(args)


def bench_resend(args: argparse.Namespace) -> int:
    from mqbatch.bench.resend import bench_resend as run_resend

    return run_resend(args)


def bench_e2e_cost(args: argparse.Namespace) -> int:
    from mqbatch.bench.e2ecost import bench_e2e_cost as run_e2e_cost

    return run_e2e_cost(args)


TARGETS = {
    "fleet": bench_fleet,
    "e2e-cost": bench_e2e_cost,
    "resend": bench_resend,
    "wire": bench_wire,
    "spark": bench_spark,
    "device": bench_device.bench_device,
    "ingest": bench_ingest,
    "latency": bench_latency,
    "all": bench_all,
    "report": bench_report,
}


def run(args: argparse.Namespace) -> int:
    return TARGETS[args.target](args)


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmarks that print figures (median [min-max])", description=__doc__.split("\n\n")[0]
    )
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    s = targets.add_parser("spark", help="records/s of the Spark pipeline (one session, 3 repetitions)")
    s.add_argument(
        "--records", type=int, default=200_000, help="records in the generated landing zone (default 200,000)"
    )
    s.add_argument("--repeat", type=int, default=3, help="repetitions of each measurement (default 3)")
    s.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of each measurement first (JIT, codegen; their seconds are printed; default 1)",
    )
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--master", default=None, help="Spark master (default local[*])")
    s.add_argument(
        "--whole",
        action="store_true",
        help="only the whole batch job (c) against the plain JSON job (d), warm in one session",
    )
    s.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="N",
        help="then N interleaved fresh-process runs of `mqbatch spark` and of the plain JSON job (default 0)",
    )
    bench_device.add_arguments(
        targets.add_parser("device", help="device pipeline in the MicroPython Unix port: us/record, flush vs busy loop")
    )
    from mqbatch.bench.ingest import add_arguments as ingest_arguments

    ingest_arguments(
        targets.add_parser("ingest", help="recorder vs counting subscriber: PUBLISH/s, peak RSS (5 repetitions)")
    )
    from mqbatch.bench.wire import add_arguments as wire_arguments

    wire_arguments(targets.add_parser("wire", help="bytes/record on the wire, records/s and heap/record vs batch size"))
    from mqbatch.bench.latency import add_arguments as latency_arguments

    latency_arguments(
        targets.add_parser(
            "latency",
            help="time to table (sampled -> readable in records/, streaming) p50/p99; --outage: the former figure",
        )
    )
    from mqbatch.bench.fleet import add_arguments as fleet_arguments

    fleet_arguments(targets.add_parser("fleet", help="N simulated devices -> broker -> recorder -> streaming job"))
    from mqbatch.bench.e2ecost import add_arguments as e2e_cost_arguments

    e2e_cost_arguments(targets.add_parser("e2e-cost", help="wire bytes end-to-end acks add per batch and record"))
    from mqbatch.bench.resend import add_arguments as resend_arguments

    resend_arguments(
        targets.add_parser("resend", help="one streaming micro-batch over a history, with and without a resent PUBLISH")
    )
    a = targets.add_parser("all", help="wire, device, ingest, spark and latency in turn, then report")
    a.add_argument("--quick", action="store_true", help="each target's smoke-test size (seconds to a minute, for CI)")
    r = targets.add_parser("report", help="render benchmarks.md and its plots from OUT/*.json")
    r.add_argument("--quick", action="store_true", help="render into OUT (the default for quick results)")
    for q in (a, r):
        q.add_argument(
            "--docs",
            type=pathlib.Path,
            default=None,
            help="directory for benchmarks.md and benchmarks/*.png (default docs/; with --quick: OUT)",
        )
    for t in targets.choices.values():
        bench_out.add_out(t)
    p.set_defaults(func=run)
