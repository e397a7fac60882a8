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
from mqbatch.spark.checkpoint import check_checkpoint_free
from mqbatch.spark.lines import REPORT_WRITTEN
from mqbatch.spark.options import add_arguments, check_paths
from mqbatch.spark.submit import build_pyfiles, run_child, submit_command, submit_env, write_log_config
from mqbatch.util.paths import ROOT
from mqbatch.util.procs import stop_signals_interrupt


def _prepare(args: argparse.Namespace, keep: pathlib.Path, java_options: list[str]) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command and its environment: the mqbatch zip, the log config, the JVM
    fast path's jar (compiled here by javac when it is not cached), `java_options`."""
    from mqbatch.spark import jvm

    pyfiles = build_pyfiles(pathlib.Path(args.pyfiles_zip) if args.pyfiles_zip else keep / "mqbatch.zip")
    log_config = (
        None
        if os.environ.get("SPARK_CONF_DIR")
        else write_log_config(pyfiles.parent.resolve() / f"spark-conf-{args.log_level.lower()}", args.log_level)
    )
    fast_path = jvm.jar()  # None: the job decodes in Python (said once, here)
    return submit_command(args, pyfiles, fast_path), submit_env(log_config, fast_path, java_options)


def run(args: argparse.Namespace, java_options: list[str] | None = None) -> int:
    """`java_options`: for the JVM (default: map the class-data archive, mqbatch.spark.cds,
    except in a printed command, which may run on another machine)."""
    from mqbatch.spark import cds

    if args.prepare:
        return prepare(args)
    missing = [flag for flag in ("--landing", "--out") if getattr(args, flag[2:]) is None]
    if missing:
        print(
            f"mqbatch spark: the following arguments are required: {', '.join(missing)} (or --prepare)", file=sys.stderr
        )
        return 2
    if not args.print_command:  # a printed command may name paths of another machine (a cluster)
        check_paths(args)
        if args.stream or args.once:  # a second stream on a checkpoint: refused before a JVM starts
            try:
                check_checkpoint_free(args.out, args.checkpoint)
            except SystemExit as e:
                print(str(e).replace("telemetry_job: ", "mqbatch spark: ", 1), file=sys.stderr)
                return 1
            except OSError as e:  # a folder it cannot make or lock
                print(
                    f"mqbatch spark: cannot lock the checkpoint {e.filename or ''}: {e.strerror or e}", file=sys.stderr
                )
                return 1
    if java_options is None:
        java_options = [] if args.print_command else cds.map_options(os.environ.get("SPARK_SUBMIT_OPTS"))
    args.spark_conf_args = [x for kv in (args.conf or []) for x in ("--conf", kv)]
    with tempfile.TemporaryDirectory(prefix="mqbatch-spark-") as tmp:
        # a printed command must point at files that outlive this process
        keep = ROOT / "build" if args.print_command else pathlib.Path(tmp)
        stop = stop_signals_interrupt("mqbatch spark")
        try:  # a stop signal while the zip is built or javac runs: one line, nothing left behind
            with stop:
                cmd, env = _prepare(args, keep, java_options)
        except KeyboardInterrupt:
            sig = stop.received or signal.SIGINT
            print(f"mqbatch spark: stopped by {signal.Signals(sig).name} before spark-submit started", file=sys.stderr)
            return 128 + sig
        if args.print_command:
            print(shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env.items())), *cmd]))
            return 0
        html = HtmlReport(args.out, "mqbatch spark", REPORT_WRITTEN)
        try:
            code = run_child(cmd, dict(os.environ, **env), html.on_line if (args.stream or args.once) else None)
        finally:
            html.close()
        if code == 0 and args.html and not (args.stream or args.once):
            html.write()
        return code


# what --prepare runs is its own: a local batch run over its own landing zone
PREPARE_REFUSES = ("landing", "out", "stream", "once", "print_command", "checkpoint", "master", "html", "hmac_keys")


def prepare(args: argparse.Namespace) -> int:
    """`mqbatch spark --prepare`: the JVM fast path's jar (when not cached) and the JVM's
    class-data archive (mqbatch.spark.cds), written by a local batch run over a small
    generated landing zone (cds.sample_landing) in a temporary folder, never by a user's job."""
    from mqbatch.spark import cds

    given = [f"--{name.replace('_', '-')}" for name in PREPARE_REFUSES if getattr(args, name, None)]
    if given:
        print(
            f"mqbatch spark: --prepare takes no {', '.join(given)} (it runs locally over its own data)", file=sys.stderr
        )
        return 2
    started = time.monotonic()
    done = cds.written()
    if done is not None and cds.loads(done):
        print(f"mqbatch spark: prepared already: {done}", file=sys.stderr)
        return 0
    path = cds.archive()
    try:
        options, pending, lock = cds.write_options()
    except cds.CdsError as e:
        if cds.directory() is None:  # turned off: nothing to write
            print(f"mqbatch spark: {e}: no class-data archive to prepare", file=sys.stderr)
            return 0
        print(f"mqbatch spark --prepare: no class-data archive: {e}", file=sys.stderr)
        return 1
    print(f"mqbatch spark: preparing the JVM's class-data archive (about 60 s): {path}", file=sys.stderr, flush=True)
    code = 1
    try:
        with tempfile.TemporaryDirectory(prefix="mqbatch-spark-prepare-") as tmp:
            args.landing = str(cds.sample_landing(pathlib.Path(tmp) / "landing"))
            args.out = str(pathlib.Path(tmp) / "out")
            args.prepare = False
            code = run(args, java_options=options)
    finally:
        why = cds.finish(pending, lock, code == 0)
    if why is not None:
        print(f"mqbatch spark --prepare: no class-data archive: {why} (exit {code})", file=sys.stderr)
        return code or 1
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
        help="write the JVM's class-data archive (mqbatch.spark.cds; once per Java and Spark, about 60 s "
        "and 170 MB: later runs' JVMs start with about 10 s less CPU) and the fast path's jar, by a local "
        "batch run over a small generated landing zone, then exit",
    )
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the spark-submit command (with its environment; runs from a clean shell) and exit",
    )
    p.set_defaults(func=run)
