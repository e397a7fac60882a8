"""`mqbatch spark`: run spark_jobs/telemetry_job.py with spark-submit.

The same job file runs locally and on a cluster. This command zips the host
package (`mqbatch`, which the job imports on the driver and in every Python
worker) and passes it with --py-files, runs the venv's spark-submit with
PYSPARK_PYTHON set to this interpreter, and forwards the job's options.
`--print-command` shows the spark-submit line to reuse on a cluster.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import zipfile

from mqbatch.paths import ROOT, venv_tool

JOB = ROOT / "spark_jobs" / "telemetry_job.py"
PACKAGE = pathlib.Path(__file__).resolve().parents[1]     # host/mqbatch


def build_pyfiles(target: pathlib.Path) -> pathlib.Path:
    """A zip of the mqbatch package (sources only) for --py-files."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(PACKAGE.rglob("*.py")):
            z.write(path, pathlib.Path("mqbatch") / path.relative_to(PACKAGE))
    return target


def job_arguments(args: argparse.Namespace) -> list[str]:
    """The telemetry_job.py options from the parsed `mqbatch spark` arguments."""
    out = ["--landing", args.landing, "--out", args.out,
           "--max-batch-size", str(args.max_batch_size), "--max-payload-bytes", str(args.max_payload_bytes),
           "--reorder-window", str(args.reorder_window), "--max-future-s", str(args.max_future_s),
           "--watermark", args.watermark]
    for flag in ("partial", "no_empty", "stream"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    if args.checkpoint:
        out += ["--checkpoint", args.checkpoint]
    return out


def submit_command(args: argparse.Namespace, pyfiles: pathlib.Path) -> list[str]:
    return [str(venv_tool("spark-submit")), "--master", args.master or "local[*]",
            "--conf", "spark.sql.session.timeZone=UTC", "--py-files", f"{pyfiles},{JOB.parent / 'telemetry_args.py'}",
            *args.spark_conf_args, str(JOB), *job_arguments(args)]


def run(args: argparse.Namespace) -> int:
    args.spark_conf_args = [x for kv in (args.conf or []) for x in ("--conf", kv)]
    with tempfile.TemporaryDirectory(prefix="mqbatch-spark-") as tmp:
        # a printed command must point at a zip that outlives this process
        default = ROOT / "build" / "mqbatch.zip" if args.print_command else pathlib.Path(tmp) / "mqbatch.zip"
        pyfiles = build_pyfiles(pathlib.Path(args.pyfiles_zip) if args.pyfiles_zip else default)
        cmd = submit_command(args, pyfiles)
        if args.print_command:
            print(shlex.join(cmd))
            return 0
        env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   PYSPARK_DRIVER_PYTHON=os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable))
        return subprocess.run(cmd, env=env).returncode


def register(sub) -> None:
    p = sub.add_parser("spark", help="run the PySpark telemetry job (spark-submit)",
                       description=__doc__.split("\n\n")[0])
    # the job's own options, defined once in spark_jobs/telemetry_job.py
    sys.path.insert(0, str(JOB.parent))
    try:
        from telemetry_args import add_arguments
    finally:
        sys.path.remove(str(JOB.parent))
    add_arguments(p)
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark configuration (repeatable)")
    p.add_argument("--pyfiles-zip", metavar="PATH",
                   help="write the mqbatch zip here (kept); default: a temp dir, or build/mqbatch.zip with --print-command")
    p.add_argument("--print-command", action="store_true", help="print the spark-submit command and exit")
    p.set_defaults(func=run)
