"""`mqbatch bench resend`: what one streaming micro-batch costs over a history, when none of
its records may be a copy and when it carries one resent PUBLISH (a device that did not
get its PUBACK sends the batch again: every reconnect of a fleet makes some).

A fleet of --devices devices, each sending one PUBLISH of --batch records per landing
file (half of the fleet in each file, as a 5-s roll of a fleet at 1 record/s with batches
of 10 gives); --history files go through the stream's own process_batch first. Then
--repeat times, in turn, three micro-batches of one file each:
- new records only;
- new records and one PUBLISH of the file 15 s before sent again (the usual resend: a
  PUBACK lost to a reconnect);
- new records and one PUBLISH of the micro-batch half the history back sent again (a
  device back after an outage whose last ack was lost: the seen state's marks say from which
  batch on to read, mqbatch.spark.seen);
- new records and one PUBLISH of micro-batch 0 sent again (no mark is older: the whole
  history is read, the worst case).
With a list of history lengths, the same at each. Timed: process_batch of that one file,
from its start to its commit, report.json not recomputed (the stream under
--report-seconds). Every micro-batch is checked: its new records are the file's records
less the resent ones (a look-back that misses the copy, or drops more, fails the run)."""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
import tempfile
import time

from mqbatch.bench import out as bench_out
from mqbatch.bench.out import spread
from mqbatch.ingest import landing as landing_zone
from mqbatch.wire import codec, records

T0_MS = 1_795_000_000_000
ROLL_S = 5  # seconds of received_at between landing files


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", type=int, default=10_000, help="devices (default 10,000)")
    p.add_argument("--batch", type=int, default=10, help="records per PUBLISH (default 10)")
    p.add_argument(
        "--history",
        default="40",
        help="landing files streamed before the timed micro-batches; a list (40,80,120) measures "
        "at each length of history in one run (default 40)",
    )
    p.add_argument("--repeat", type=int, default=5, help="timed micro-batches of each kind, in turn (default 5)")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")


class Fleet:
    """The landing files of a fleet: file k holds one PUBLISH of `batch` new records from each
    device of half k % 2, received ROLL_S * k seconds after T0."""

    def __init__(self, directory: pathlib.Path, devices: int, batch: int):
        self.directory, self.devices, self.batch = directory, devices, batch
        self.seqs = [0] * devices
        self.kept: dict[int, landing_zone.Landed] = {}  # file -> its first PUBLISH (to send again)
        directory.mkdir(parents=True, exist_ok=True)

    def file(self, k: int, resend_of: int | None = None) -> tuple[pathlib.Path, int, int]:
        """Writes file k; with resend_of, the first PUBLISH of that earlier file is in it again.
        Returns (path, records in it, records of them that are copies)."""
        received_us = (T0_MS + ROLL_S * 1000 * k) * 1000
        rows = []
        for dev in range(k % 2, self.devices, 2):
            recs = []
            for _ in range(self.batch):
                s = self.seqs[dev]
                recs.append(("sample", 1, s, T0_MS + s * 1000, [(1, (dev * 7 + s) % 4000), (2, s % 10000)]))
                self.seqs[dev] = s + 1
            props, payload = codec.encode_batch([records.encode_binary(*r) for r in recs])
            rows.append(
                landing_zone.Landed(
                    f"mqbatch/dev-{dev:05d}/telemetry", payload, list(props), received_at_us=received_us
                )
            )
        self.kept[k] = rows[0]
        copies = 0
        if resend_of is not None:
            first = self.kept[resend_of]
            rows.append(
                landing_zone.Landed(first.topic, first.payload, first.user_properties, received_at_us=received_us)
            )
            copies = self.batch
        name = landing_zone.parquet_name("bench", k)
        landing_zone.write_parquet_atomic(landing_zone.to_table(rows, "bench", k), self.directory, name)
        return self.directory / name, len(rows) * self.batch, copies


def bench_resend(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import mqbatch.spark as S
    from mqbatch.spark import stream

    try:
        points = sorted({int(h) for h in str(args.history).split(",")})
    except ValueError:
        raise SystemExit(f"bench resend: --history {args.history!r}: a number of files, or a list such as 40,80,120")
    if points[0] < 2 or args.repeat < 1 or args.devices < 2 or args.batch < 1:
        raise SystemExit("bench resend: needs --history >= 2, --repeat >= 1, --devices >= 2, --batch >= 1")
    per_file = (args.devices + 1) // 2 * args.batch  # (the larger half)
    figures: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-") as tmp:
        tmp_p = pathlib.Path(tmp)
        fleet, out = Fleet(tmp_p / "landing", args.devices, args.batch), tmp_p / "out"
        spark = S.session(args.master, "WARN", **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        try:
            opts = S.JobOptions()
            cadence = stream.ReportCadence(10**9)
            cadence.done()  # the commits only: report.json is the stream's other cost, not timed here

            def micro_batch(k: int, resend_of: int | None = None) -> tuple[float, float]:
                path, n, copies = fleet.file(k, resend_of)
                said: list[str] = []
                files = spark.createDataFrame([(str(path),)], "path string")
                started = time.monotonic()
                stream.process_batch(
                    spark, files, k, str(out), opts, say=lambda line, **_: said.append(line), cadence=cadence
                )
                took = time.monotonic() - started
                line = next((s for s in said if "in records/ after" in s), "")
                got = re.search(r"(\d+) new records, .* in records/ after ([0-9.]+) s", line)
                if got is None or int(got.group(1)) != n - copies:
                    raise SystemExit(
                        f"bench resend: micro-batch {k} ({n} records, {copies} of them copies) said {said!r}: "
                        f"expected {n - copies} new records"
                    )
                return took, float(got.group(2))

            k, started = 0, time.monotonic()
            print(
                f"one micro-batch of one landing file ({per_file:,} new records), process_batch to its commit "
                "(report.json not recomputed), median [min..max]:",
                flush=True,
            )
            for point in points:
                while k < point:  # the history (the timed micro-batches of an earlier point are part of it)
                    micro_batch(k)
                    k += 1
                history, before = sum(fleet.seqs), k
                plain: list[tuple[float, float]] = []
                recent: list[tuple[float, float]] = []
                half: list[tuple[float, float]] = []
                old: list[tuple[float, float]] = []
                for _ in range(args.repeat):  # in turn, so that all kinds see the same JVM and history
                    plain.append(micro_batch(k))
                    recent.append(micro_batch(k + 1, resend_of=k - 2))  # sent 15 s before
                    half.append(micro_batch(k + 2, resend_of=(k + 2) // 2))
                    old.append(micro_batch(k + 3, resend_of=0))
                    k += 4
                print(
                    f"  history {before} micro-batches, {history:,} records of {args.devices:,} devices "
                    f"({time.monotonic() - started:.0f} s so far):\n"
                    f"    no record may be a copy: {spread([r[0] for r in plain], '.2f')} s\n"
                    f"    + one PUBLISH of 15 s before sent again: {spread([r[0] for r in recent], '.2f')} s, "
                    f"{_ratio(recent, plain)} of the first line\n"
                    f"    + one PUBLISH of half the history before ({before // 2 * ROLL_S // 60} min or more) sent "
                    f"again: {spread([r[0] for r in half], '.2f')} s, {_ratio(half, plain)} of the first line\n"
                    f"    + one PUBLISH of micro-batch 0 sent again: {spread([r[0] for r in old], '.2f')} s, "
                    f"{_ratio(old, plain)} of the first line",
                    flush=True,
                )
                figures.append(
                    {
                        "history_batches": before,
                        "history_records": history,
                        "no_copy_s": [r[0] for r in plain],
                        "recent_resend_s": [r[0] for r in recent],
                        "half_history_resend_s": [r[0] for r in half],
                        "old_resend_s": [r[0] for r in old],
                        "readable_s": {
                            "no_copy": [r[1] for r in plain],
                            "recent_resend": [r[1] for r in recent],
                            "half_history_resend": [r[1] for r in half],
                            "old_resend": [r[1] for r in old],
                        },
                    }
                )
        finally:
            spark.stop()  # (also when a micro-batch fails the check)
    bench_out.write_result(
        args,
        "resend",
        {"devices": args.devices, "batch": args.batch, "records_per_file": per_file, "points": figures},
    )
    return 0


def _ratio(runs: list[tuple[float, float]], base: list[tuple[float, float]]) -> str:
    """Per pair (same repetition), median [min..max] of the seconds of runs / base."""
    return "x" + spread([a[0] / b[0] for a, b in zip(runs, base)], ".2f")
