"""`mqbatch bench spark`: records/s of the Spark pipeline on a generated landing zone,
against a from_json job over the same records as JSON arrays, in the same session
(docs/spark.md)."""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

from mqbatch.bench import out as bench_out
from mqbatch.ingest import landing as landing_zone
from mqbatch.wire import codec, records

T0_MS = 1_795_000_000_000
PER_PUBLISH = 50
PER_FILE = 100_000


def build_landing(directory: pathlib.Path, n: int, seed: int = 1, devices: int = 10) -> tuple[int, pathlib.Path]:
    """A landing zone of n binary records (PUBLISHes of 50, seeded values) in recorder
    files of 100,000 records, and the same records as JSON arrays (one string per
    PUBLISH) in files of the same split in DIR/../json/ for the from_json baseline.
    Returns (records, json directory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    json_dir = directory.parent / "json"
    json_dir.mkdir(exist_ok=True)
    rows, json_rows, json_topics, json_received, made, segment = [], [], [], [], 0, 0
    seqs = [0] * devices
    while made < n:
        dev = made // PER_PUBLISH % devices
        count = min(PER_PUBLISH, n - made)
        recs = []
        for _ in range(count):
            t = T0_MS + seqs[dev] * 1000
            recs.append(
                (
                    "sample",
                    1,
                    seqs[dev],
                    t,
                    [(1, rng.randint(-500, 4000)), (2, rng.randint(0, 10000)), (3, rng.randint(3000, 3400))],
                )
            )
            seqs[dev] += 1
        props, payload = codec.encode_batch([records.encode_binary(*r) for r in recs])
        received = (recs[-1][3] + 300) * 1000
        rows.append(
            landing_zone.Landed(f"mqbatch/dev-{dev:03d}/telemetry", payload, list(props), received_at_us=received)
        )
        json_rows.append("[" + ",".join(records.encode_json(*r).decode() for r in recs) + "]")
        json_topics.append(f"mqbatch/dev-{dev:03d}/telemetry")
        json_received.append(received)
        made += count
        if made % PER_FILE == 0 or made == n:
            landing_zone.write_parquet_atomic(
                landing_zone.to_table(rows, "bench", segment), directory, landing_zone.parquet_name("bench", segment)
            )
            # the JSON arrays split as the landing files are, so that Spark reads both with the same
            # parallelism (one file of one row group would run (b) in a single task)
            pq.write_table(
                pa.table(
                    {
                        "topic": json_topics,
                        "payload": json_rows,
                        "received_at": pa.array(json_received, pa.timestamp("us", tz="UTC")),
                    }
                ),
                json_dir / f"json-{segment:08d}.parquet",
            )
            rows, json_rows, json_topics, json_received, segment = [], [], [], [], segment + 1
    return made, json_dir


JSON_TYPE = "array<struct<v:int,kind:string,boot:bigint,seq:bigint,ts_ms:bigint,synced:boolean,r:map<string,bigint>>>"


def json_job(spark, json_dir: str, out: str) -> None:
    """The plain JSON pipeline a user would write instead of mqbatch's job, over the same
    records as JSON arrays (one string per PUBLISH): from_json + explode, the device from
    the topic, dropDuplicates on (device, boot, seq), one Parquet write."""
    from pyspark.sql import functions as F

    (
        spark.read.parquet(json_dir)
        .select(
            F.split("topic", "/").getItem(1).alias("device"),
            "received_at",
            F.explode(F.from_json("payload", JSON_TYPE)).alias("x"),
        )
        .select(
            "device",
            "x.kind",
            "x.boot",
            "x.seq",
            F.timestamp_millis("x.ts_ms").alias("device_time"),
            "x.synced",
            F.col("x.r").alias("readings"),
            "received_at",
        )
        .dropDuplicates(["device", "boot", "seq"])
        .write.mode("overwrite")
        .parquet(out)
    )


def _json_job_main(argv: list[str]) -> int:
    """python -m mqbatch.bench.spark JSON_DIR OUT: json_job in a fresh local[*] session
    (the cold baseline of `bench spark --cold`)."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        json_job(spark, argv[0], argv[1])
    finally:
        spark.stop()
    return 0


def _cold(tmp: pathlib.Path, json_dir: pathlib.Path, runs: int, n: int) -> dict:
    """Fresh processes, interleaved: `mqbatch spark` as a user runs it (spark-submit, its own
    JVM) against the plain JSON job in its own JVM. Wall seconds of the whole command."""
    import subprocess

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmds = {
        "mqbatch spark (whole command, fresh JVM)": [
            sys.executable,
            "-m",
            "mqbatch.cli",
            "spark",
            "--landing",
            str(tmp / "landing"),
            "--out",
            str(tmp / "cold"),
        ],
        "plain JSON job (python, fresh JVM)": [
            sys.executable,
            "-m",
            "mqbatch.bench.spark",
            str(json_dir),
            str(tmp / "cold-json"),
        ],
    }
    times: dict = {k: [] for k in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            t = time.monotonic()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            times[name].append(time.monotonic() - t)
            if proc.returncode != 0:
                raise SystemExit(f"bench spark --cold: {name} exited {proc.returncode}: {proc.stderr[-2000:]}")
    for name, secs in times.items():
        print(f"cold: {name}: {_summary(secs, n)}", flush=True)
    a, b = (statistics.median(v) for v in times.values())
    print(
        f"cold ratio, plain JSON job / mqbatch spark (seconds, medians; >= 1 means mqbatch is as fast or faster): {b / a:.2f}"
    )
    return times


def _summary(seconds: list[float], n: int) -> str:
    rates = sorted(n / s for s in seconds)
    return (
        f"{statistics.median(rates):,.0f} records/s [{rates[0]:,.0f}-{rates[-1]:,.0f}] "
        f"({statistics.median(seconds):.2f} s [{min(seconds):.2f}-{max(seconds):.2f}])"
    )


def _spark_work(spark, group: str) -> tuple[int, int, int]:
    """(jobs, stages, tasks) Spark ran under a job group."""
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    stages = [s for j in jobs for s in (tracker.getJobInfo(j).stageIds if tracker.getJobInfo(j) else [])]
    tasks = sum(info.numTasks for s in stages if (info := tracker.getStageInfo(s)))
    return len(jobs), len(stages), tasks


def _no_rows(batches):
    for batch in batches:
        yield batch.slice(0, 0)


def bench_spark(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    import mqbatch.spark as S

    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        started = time.monotonic()
        n, json_dir = build_landing(tmp / "landing", args.records, args.seed)
        print(
            f"landing zone: {n:,} records in {n // PER_PUBLISH + (n % PER_PUBLISH > 0):,} PUBLISHes "
            f"({time.monotonic() - started:.1f} s to build, seed {args.seed})",
            flush=True,
        )
        spark = S.session(args.master, "WARN", **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        opts = S.JobOptions()
        json_type = JSON_TYPE

        def explode_to_noop(decoded, part):
            S.records(decoded).select("device", "seq", F.explode("readings").alias("r")).write.format("noop").mode(
                "overwrite"
            ).save()

        def ours(fast_path=None):  # the batch job's decode step (compact rows, JVM fast path when on)
            S.job_decode_to(
                spark, S.read_landing(spark, str(tmp / "landing")), opts, explode_to_noop, fast_path=fast_path
            )

        def python_only():
            ours(fast_path=False)

        def from_json():
            spark.read.parquet(str(json_dir)).select(F.explode(F.from_json("payload", json_type)).alias("x")).select(
                "x.seq", F.explode("x.r")
            ).write.format("noop").mode("overwrite").save()

        def exchange():  # (a)'s floor: the landed rows to the Python workers and back, no decoding
            S.size_arrow_batches(spark, opts)
            S.read_landing(spark, str(tmp / "landing")).select(*S.LANDED_COLUMNS).mapInArrow(
                _no_rows, S.LANDING_SCHEMA
            ).write.format("noop").mode("overwrite").save()

        steps: dict = {}

        def full():
            steps.clear()
            S.run_batch(spark, str(tmp / "landing"), str(tmp / "out"), opts, steps)

        def plain_json_job():
            json_job(spark, str(json_dir), str(tmp / "out-json"))

        from mqbatch.spark import jvm

        fast_path = jvm.registered(spark)
        print(
            "decode step: "
            + (
                f"JVM fast path on ({jvm.jar()}), the Python decoders for the other rows"
                if fast_path
                else "JVM fast path off (see above): the Python decoders only"
            ),
            flush=True,
        )
        results, warmups = {}, {}
        measured = [
            ("(a) mqbatch decode+validate+explode", ours),
            ("(b) from_json+explode (JSON arrays)", from_json),
            ("(a1) (a) with the Python decoders only (JVM fast path off)", python_only),
            ("(a0) the Arrow exchange of (a1) alone (mapInArrow returning no rows)", exchange),
            ("(c) full batch job (records/, quarantine/, report)", full),
            ("(d) plain JSON job (from_json+explode+dropDuplicates+Parquet)", plain_json_job),
        ]
        if args.whole:
            measured = measured[-2:]
        cpu: dict = {}
        for name, fn in measured:
            times, cold, busy = [], [], []
            for rep in range(-args.warmup, args.repeat):  # the warm-up runs (JIT, codegen) are not counted
                group = f"bench-{name[:3]}-{rep}"
                spark.sparkContext.setJobGroup(group, name)
                busy_before, t = bench_out.machine_busy_s(), time.monotonic()
                fn()
                (cold if rep < 0 else times).append(time.monotonic() - t)
                if rep >= 0 and busy_before is not None:
                    busy.append(bench_out.machine_busy_s() - busy_before)
            results[name] = times
            warmups[name] = cold
            cpu[name] = busy
            jobs, stages, tasks = _spark_work(spark, group)
            print(
                f"{name}: {_summary(times, n)}"
                + (f"; machine CPU {bench_out.spread(busy, '.2f')} s" if busy else "")
                + f"; last run: {jobs} Spark jobs, {stages} stages, {tasks} tasks"
                + (
                    f"; warm-up run{'s' if len(cold) > 1 else ''} {', '.join(f'{c:.2f}' for c in cold)} s"
                    if cold
                    else ""
                ),
                flush=True,
            )
        print("(c) last run, seconds per step: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()))
        c, d = (statistics.median(results[k]) for k in list(results)[-2:])
        print(f"ratio (c)/(d) records/s, whole job against the plain JSON job, medians of this run: {d / c:.2f}")
        a, b = (statistics.median(results[k]) for k in list(results)[:2])
        if not args.whole:
            print(f"ratio (a)/(b) records/s, medians of this run: {b / a:.2f}")
        spark.stop()
        cold = _cold(tmp, json_dir, args.cold, n) if args.cold else {}
    bench_out.write_result(
        args,
        "spark",
        {
            "records": n,
            "repeat": args.repeat,
            "seed": args.seed,
            "warmup": args.warmup,
            "warmup_seconds": warmups,
            "jvm_fast_path": fast_path,
            "seconds": results,
            "machine_cpu_seconds": cpu,
            "ratio_a_over_b": None if args.whole else b / a,
            "ratio_c_over_d": d / c,
            "cold_seconds": cold,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(_json_job_main(sys.argv[1:]))
