"""The telemetry job's command line (spark-submit spark_jobs/telemetry_job.py ...,
or `mqbatch spark`): landing zone -> records/, quarantine/, report.json."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from mqbatch.spark import beside, cds, jvm
from mqbatch.spark.checkpoint import take_checkpoint
from mqbatch.spark.lines import REPORT_WRITTEN
from mqbatch.spark.options import add_arguments, check_paths, options_from
from mqbatch.spark.pipeline import HADOOP_UMASK, PARQUET_TIMESTAMPS, run_batch
from mqbatch.spark.stream import run_stream
from mqbatch.util.procs import die_with_parent


@contextlib.contextmanager
def _submit_opts(options: list[str]):
    """SPARK_SUBMIT_OPTS with `options` added while pyspark launches the JVM, then as it was."""
    before = os.environ.get("SPARK_SUBMIT_OPTS")
    if options:
        os.environ["SPARK_SUBMIT_OPTS"] = cds.with_options(options, before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)
        else:
            os.environ["SPARK_SUBMIT_OPTS"] = before


def session(master: str | None = None, log_level: str | None = None, **conf_items: str) -> SparkSession:
    """The job's session: --master, else what spark-submit set, else local[*]. conf_items:
    extra settings (spark.ui.showConsoleProgress="false", ...) for a session started here."""
    # Start (or join) the JVM first: under spark-submit it holds spark-submit's
    # settings (--master among them), which a SparkConf made before it cannot see;
    # setting local[*] then would silently run a cluster submission locally.
    if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        # we start the JVM: the JVM fast path's jar goes on its class path (spark.jars;
        # spark-submit's own --jars, e.g. from `mqbatch spark`, already did it)
        # and it maps the JVM's class-data archive when there is one (mqbatch.spark.cds)
        launch = SparkConf()
        jars = jvm.with_jar(conf_items.pop("spark.jars", None))
        if jars:
            launch.set("spark.jars", jars)
        with _submit_opts(cds.map_options(os.environ.get("SPARK_SUBMIT_OPTS"))):
            SparkContext._ensure_initialized(conf=launch)
    SparkContext._ensure_initialized()
    conf = SparkConf()
    if master:
        conf.setMaster(master)
    elif not conf.contains("spark.master"):
        conf.setMaster("local[*]")
    for key, value in conf_items.items():
        conf.set(key, value)
    # a micro-batch goes first, work beside the stream takes the idle cores (unless set otherwise)
    for key, value in beside.scheduler_conf(dict(conf.getAll()), lambda line: print(line, file=sys.stderr)).items():
        conf.set(key, value)
    spark = (
        SparkSession.builder.appName("mqbatch-telemetry")
        .config(conf=conf)
        .config("spark.sql.session.timeZone", "UTC")
        .config(*PARQUET_TIMESTAMPS)
        .config(f"spark.hadoop.{HADOOP_UMASK[0]}", HADOOP_UMASK[1])
        .getOrCreate()
    )
    if log_level:
        spark.sparkContext.setLogLevel(log_level)
    return spark


def run(args: argparse.Namespace, spark: SparkSession | None = None) -> dict:
    opts = options_from(args)
    spark = spark or session(args.master, args.log_level)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if args.stream or args.once:
        return run_stream(
            spark,
            args.landing,
            args.out,
            opts,
            args.checkpoint,
            trigger_seconds=args.trigger_seconds if args.stream else None,
            on_report=lambda out: print(f"{REPORT_WRITTEN} ({out})", flush=True),
            report_seconds=args.report_seconds if args.stream else 0,
            max_bytes_per_trigger=args.max_mb_per_trigger << 20,
            warm_up=args.stream and not args.no_warm_up,
        )
    return run_batch(spark, args.landing, args.out, opts, say=lambda line: print(line, file=sys.stderr, flush=True))


def summary(report: dict, out: str) -> str:
    q = report["quarantine"]
    return (
        f"telemetry_job: {report['landed']} landed PUBLISHes, {report['records']['unique']} records "
        f"({report['records']['duplicates']} duplicates), {q['rows']} quarantined "
        f"{json.dumps(q['by_reason'], sort_keys=True)}, {q['files']} landing files quarantined, "
        f"{report['records'].get('key_collisions', 0)} key collisions (kept), "
        f"{report.get('skipped_landing_entries', {}).get('count', 0)} landing entries skipped -> {out}"
    )


def _stop_on(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="telemetry_job.py", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    check_paths(args)
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: this driver dies with its JVM
        die_with_parent(os.getppid())
    if args.stream or args.once:  # one stream per checkpoint: a second one fails before its SparkContext starts
        take_checkpoint(args.out, args.checkpoint)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop like Ctrl-C: the query ends, the JVM is stopped
        signal.signal(sig, _stop_on)
    spark = session(args.master, args.log_level)
    try:
        report = run(args, spark)
    except KeyboardInterrupt:
        print("telemetry_job: stopped", file=sys.stderr)
        return 130
    finally:
        spark.stop()
    print(summary(report, args.out))
    for bad in report["quarantined_files"]:
        print(
            f"telemetry_job: quarantined landing file {bad['file']}: {bad['reason']}: {bad['detail']}", file=sys.stderr
        )
    return 0
