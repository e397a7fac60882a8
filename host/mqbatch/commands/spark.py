"""`mqbatch spark`: run the telemetry job (mqbatch.spark, entry spark_jobs/telemetry_job.py)
with spark-submit.

The same job runs locally and on a cluster. This command checks its arguments
(before any JVM starts), zips the host package (`mqbatch`, which the job imports on
the driver and in every Python worker) for --py-files, and runs the venv's
spark-submit with SPARK_HOME, PYSPARK_PYTHON and a log configuration (default WARN)
set. `--print-command` prints that line with absolute paths and its environment, so
it runs from a clean shell. SIGINT, SIGTERM and SIGHUP end spark-submit and
everything it started (its process group); a SIGKILL of this command ends its JVM too
(PR_SET_PDEATHSIG), and the job's Python driver dies with the JVM. With --stream/--once it
writes the HTML report (mqbatch.report) next to report.json each time the job rewrote
report.json (in a thread of its own); a batch run writes it with --html.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import signal
import sys
import tempfile
import time

from mqbatch.commands.report import HtmlReport
from mqbatch.spark.options import add_arguments, check_paths
from mqbatch.spark.stream import REPORT_WRITTEN
from mqbatch.spark.submit import build_pyfiles, run_child, submit_command, submit_env, write_log_config
from mqbatch.util.paths import ROOT
from mqbatch.util.procs import stop_signals_interrupt


def _prepare(args: argparse.Namespace, keep: pathlib.Path) -> tuple[list[str], dict[str, str], pathlib.Path | None]:
    """The spark-submit command, its environment, and the class-data archive its JVM writes
    (mqbatch.spark.cds; None when it maps one or writes none): the mqbatch zip, the log
    config, the JVM fast path's jar (compiled here by javac when it is not cached)."""
    from mqbatch.spark import cds, jvm

    pyfiles = build_pyfiles(pathlib.Path(args.pyfiles_zip) if args.pyfiles_zip else keep / "mqbatch.zip")
    log_config = (
        None
        if os.environ.get("SPARK_CONF_DIR")
        else write_log_config(pyfiles.parent.resolve() / f"spark-conf-{args.log_level.lower()}", args.log_level)
    )
    fast_path = jvm.jar()  # None: the job decodes in Python (said once, here)
    # a batch run writes the archive when there is none (a stream ends by a signal: never)
    create = not (args.print_command or args.stream or args.once)
    java_options, pending = cds.java_options(create=create)
    if pending is not None:
        print(
            f"mqbatch spark: this run also writes the JVM's class-data archive for later runs, once per Java "
            f"and Spark (about 170 MB; this run takes about 30 s longer): {pending.parent}",
            file=sys.stderr,
            flush=True,
        )
    return submit_command(args, pyfiles, fast_path), submit_env(log_config, fast_path, java_options), pending


def run(args: argparse.Namespace) -> int:
    if args.prepare:
        return prepare(args)
    missing = [flag for flag in ("--landing", "--out") if getattr(args, flag[2:]) is None]
    if missing:
        raise SystemExit(f"mqbatch spark: the following arguments are required: {', '.join(missing)} (or --prepare)")
    if not args.print_command:  # a printed command may name paths of another machine (a cluster)
        check_paths(args)
    args.spark_conf_args = [x for kv in (args.conf or []) for x in ("--conf", kv)]
    with tempfile.TemporaryDirectory(prefix="mqbatch-spark-") as tmp:
        # a printed command must point at files that outlive this process
        keep = ROOT / "build" if args.print_command else pathlib.Path(tmp)
        stop = stop_signals_interrupt("mqbatch spark")
        try:  # a stop signal while the zip is built or javac runs: one line, nothing left behind
            with stop:
                cmd, env, pending = _prepare(args, keep)
        except KeyboardInterrupt:
            sig = stop.received or signal.SIGINT
            print(f"mqbatch spark: stopped by {signal.Signals(sig).name} before spark-submit started", file=sys.stderr)
            return 128 + sig
        if args.print_command:
            print(shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env.items())), *cmd]))
            return 0
        html = HtmlReport(args.out, "mqbatch spark", REPORT_WRITTEN)
        code = 1
        try:
            code = run_child(cmd, dict(os.environ, **env), html.on_line if (args.stream or args.once) else None)
        finally:
            html.close()
            from mqbatch.spark import cds

            cds.finish(pending, code == 0)
        if code == 0 and args.html and not (args.stream or args.once):
            html.write()
        return code


def prepare(args: argparse.Namespace) -> int:
    """`mqbatch spark --prepare`: what a first run builds, built now: the JVM fast path's jar
    and the JVM's class-data archive (mqbatch.spark.cds), by a batch run over a small generated
    landing zone (mqbatch.spark.cds.sample_landing) in a temporary folder."""
    from mqbatch.spark import cds

    started = time.monotonic()
    path = cds.archive()
    if path is not None and path.is_file():
        print(f"mqbatch spark: prepared already: {path}", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="mqbatch-spark-prepare-") as tmp:
        args.landing = str(cds.sample_landing(pathlib.Path(tmp) / "landing"))
        args.out = str(pathlib.Path(tmp) / "out")
        args.prepare = False
        code = run(args)
    if code != 0:
        return code
    path = cds.archive()
    if path is None or not path.is_file():
        why = "MQBATCH_JVM_CDS=off" if cds.directory() is None else "no java, or a SPARK_CONF_DIR with files"
        print(f"mqbatch spark: prepared the fast path; no class-data archive ({why})", file=sys.stderr)
        return 0
    print(
        f"mqbatch spark: prepared in {time.monotonic() - started:.0f} s: {path} ({path.stat().st_size >> 20} MB)",
        file=sys.stderr,
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "spark", help="run the PySpark telemetry job (spark-submit)", description=__doc__.split("\n\n")[0]
    )
    add_arguments(p, paths_required=False)  # the job's own options (mqbatch.spark.options); run() checks the paths
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark configuration (repeatable)")
    p.add_argument(
        "--html",
        action="store_true",
        help="batch mode: also write OUT/report.html (`mqbatch report`; it reads all of records/: "
        "84 s for 300,000 records on a loaded 2-core VM); --stream/--once always write it",
    )
    p.add_argument(
        "--pyfiles-zip",
        metavar="PATH",
        help="write the mqbatch zip here (kept); default: a temp dir, or build/mqbatch.zip with --print-command",
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help="build what a first run builds and exit: the JVM fast path's jar and the JVM's class-data "
        "archive (mqbatch.spark.cds: later JVMs start in about half the CPU), over a small generated "
        "landing zone; --landing and --out are not needed",
    )
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the spark-submit command (with its environment; runs from a clean shell) and exit",
    )
    p.set_defaults(func=run)
