"""Running the telemetry job with spark-submit: the --py-files zip of the mqbatch package,
a log configuration, the command line and environment that run from a clean shell, and
the child process group that a stop signal ends as a whole (`mqbatch spark` is the command)."""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

from mqbatch.spark import beside
from mqbatch.spark.jvm import pyspark_home
from mqbatch.spark.lines import LOCK_HELD, PROGRESS
from mqbatch.util.paths import CHECKOUT, venv_tool
from mqbatch.util.procs import die_with_parent, on_stop_signals, restore_signals

# the spark-submit main file: the checkout's thin entry, or (installed package) the same
# two lines written next to the --py-files zip
JOB = CHECKOUT / "spark_jobs" / "telemetry_job.py" if CHECKOUT is not None else None
JOB_ENTRY = "import sys\nfrom mqbatch.spark.job import main\n\nif __name__ == \"__main__\":\n    sys.exit(main())\n"
PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # host/mqbatch
STOP_GRACE_S = 20  # after SIGTERM, then SIGKILL
WAIT_POLL_S = 0.5  # how often run_child looks at the time while spark-submit runs
TO_STDERR = (PROGRESS.encode(), LOCK_HELD.encode())  # lines of the job's stdout that go to our stderr


def build_pyfiles(target: pathlib.Path) -> pathlib.Path:
    """A zip of the mqbatch package (sources only: its Python, and the Java of the JVM pass,
    whose text the stream's reuse of a report hashes, stream.REPORT_CODE) for --py-files."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.java")]):
            z.write(path, pathlib.Path("mqbatch") / path.relative_to(PACKAGE))
    return target


def write_log_config(directory: pathlib.Path, level: str) -> pathlib.Path:
    """A log4j2.properties in `directory` that logs `level` and above to stderr (the JVM is
    told with -Dlog4j2.configurationFile: a SPARK_CONF_DIR would put a folder with files on
    its class path, and such a JVM cannot write its class-data archive, mqbatch.spark.cds)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "log4j2.properties"
    path.write_text(
        f"rootLogger.level = {level.lower()}\n"
        "rootLogger.appenderRef.stderr.ref = stderr\n"
        "appender.console.type = Console\n"
        "appender.console.name = stderr\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex\n",
        encoding="utf-8",
    )
    return path


def spark_home() -> pathlib.Path:
    """The pyspark installation of this interpreter (what find_spark_home.py looks for)."""
    try:
        return pyspark_home()
    except ImportError:
        raise SystemExit(f"mqbatch spark: pyspark is not installed for {sys.executable} (run `make setup`)") from None


def submit_env(
    log_config: pathlib.Path | None, fast_path: pathlib.Path | None, java_options: list[str] | None = None
) -> dict[str, str]:
    """The variables spark-submit needs, whatever the calling shell has (or lacks). The
    driver JVM's options go in SPARK_SUBMIT_OPTS: the log configuration (`log_config`), then
    `java_options` (mqbatch.spark.cds), then the caller's own, which win (the JVM takes the
    last of an option). Without the fast path's jar (this command said why) the job is told
    not to say it again."""
    from mqbatch.spark import cds, jvm

    env = {
        "SPARK_HOME": os.environ.get("SPARK_HOME") or str(spark_home()),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
    }
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    options = ([f"-Dlog4j2.configurationFile={log_config}"] if log_config is not None else []) + (java_options or [])
    if options or os.environ.get("SPARK_SUBMIT_OPTS"):
        env["SPARK_SUBMIT_OPTS"] = cds.with_options(options, os.environ.get("SPARK_SUBMIT_OPTS"))
    if fast_path is None:
        env[jvm.OFF_SAID] = "1"
    return env


def job_arguments(args: argparse.Namespace) -> list[str]:
    """The telemetry_job.py options from the parsed `mqbatch spark` arguments."""
    out = [
        "--landing",
        args.landing,
        "--out",
        args.out,
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-payload-bytes",
        str(args.max_payload_bytes),
        "--reorder-window",
        str(args.reorder_window),
        "--max-future-s",
        str(args.max_future_s),
        "--watermark",
        args.watermark,
        "--log-level",
        args.log_level,
    ]
    for flag in ("partial", "no_empty", "stream", "once", "no_warm_up"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    if args.stream:
        out += ["--trigger-seconds", str(args.trigger_seconds), "--report-seconds", str(args.report_seconds)]
    if args.stream or args.once:
        out += ["--max-mb-per-trigger", str(args.max_mb_per_trigger)]
    if args.checkpoint:
        out += ["--checkpoint", args.checkpoint]
    if args.hmac_keys:
        out += ["--hmac-keys", args.hmac_keys]
    return out


def job_file(directory: pathlib.Path) -> pathlib.Path:
    """The main file for spark-submit (written into `directory` outside a checkout)."""
    if JOB is not None:
        return JOB
    path = directory / "telemetry_job.py"
    path.write_text(JOB_ENTRY, encoding="utf-8")
    return path


def submit_command(args: argparse.Namespace, pyfiles: pathlib.Path, fast_path: pathlib.Path | None) -> list[str]:
    """fast_path: the decoder's JVM fast path (mqbatch.spark.jvm.jar()), shipped to the executors too."""
    return [
        str(venv_tool("spark-submit")),
        "--master",
        args.master or "local[*]",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        *(["--jars", str(fast_path)] if fast_path else []),
        "--py-files",
        str(pyfiles.resolve()),
        *_scheduler_args(args.spark_conf_args),
        *args.spark_conf_args,
        str(job_file(pyfiles.parent.resolve())),
        *job_arguments(args),
    ]


def _scheduler_args(conf_args: list[str]) -> list[str]:
    """--conf arguments for beside.SCHEDULER unless the user's own set the mode or the pools' file."""
    configured = {a.split("=", 1)[0] for a in conf_args if "=" in a}
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    return [x for key, value in beside.scheduler_conf(configured, say).items() for x in ("--conf", f"{key}={value}")]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_child(cmd: list[str], env: dict[str, str], on_line=None) -> int:
    """Run spark-submit in its own process group; a signal to us ends the whole group.

    Its output passes through us line by line (the Python driver's stdout and stderr
    arrive on the JVM's stdout: PythonRunner merges and copies them). After a stop
    signal, what it prints
    while it dies goes to a file named in our last line, not to the terminal: the
    SIGTERM reaches the Python driver while it waits in a py4j call to the JVM (which
    stops at the same moment), and py4j logs every such interrupted call as an ERROR
    with a traceback (plus a BrokenPipeError from the closed gateway), or the
    interrupt escapes the job's SparkSession start-up as a traceback. That is noise
    about a stop the user asked for, not a failure of the job. PR_SET_PDEATHSIG: spark-submit
    (the JVM, after its exec) gets SIGKILL when we die, however we die. `on_line(bytes)` is
    called with each line of its stdout."""
    received: list[int] = []
    held: list[bytes] = []  # output after the stop signal
    started: list[subprocess.Popen] = []
    kill_at: list[float] = []  # the first stop signal's time + STOP_GRACE_S

    def forward(signum, frame):
        received.append(signum)
        if not kill_at:
            kill_at.append(time.monotonic() + STOP_GRACE_S)
        if started and _group_alive(started[0].pid):
            os.killpg(started[0].pid, signal.SIGTERM)

    # the handlers go in before spark-submit starts: a signal in between would otherwise kill us
    # with the default action and leave the JVM to die_with_parent alone, with no line said
    old = on_stop_signals(forward)
    try:
        proc = subprocess.Popen(
            cmd,
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    except BaseException:
        restore_signals(old)
        raise
    started.append(proc)
    if received:  # a stop signal came while spark-submit was starting
        os.killpg(proc.pid, signal.SIGTERM)

    def relay(source, sink):
        for line in source:
            if received:
                held.append(line)
                continue
            # the job's progress and error lines reach us on the JVM's stdout (PythonRunner): stderr is theirs
            out = sys.stderr if line.startswith(TO_STDERR) else sink
            out.buffer.write(line)
            out.flush()
            if on_line is not None and sink is sys.stdout:
                on_line(line)

    relays = [
        threading.Thread(target=relay, args=(proc.stdout, sys.stdout), name="spark-stdout", daemon=True),
        threading.Thread(target=relay, args=(proc.stderr, sys.stderr), name="spark-stderr", daemon=True),
    ]
    for t in relays:
        t.start()

    try:  # polled: the handler cannot wake a wait without a timeout, so a group that
        # ignores SIGTERM (a JVM stuck in its shutdown hooks) would keep us here for ever
        while True:
            try:
                code = proc.wait(timeout=WAIT_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if kill_at and time.monotonic() >= kill_at[0] and _group_alive(proc.pid):
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        restore_signals(old)
    if _group_alive(proc.pid):  # a JVM or Python worker that outlived spark-submit
        os.killpg(proc.pid, signal.SIGKILL)
    for t in relays:
        t.join(5)
    if received:
        where = ""
        if held:
            fd, path = tempfile.mkstemp(prefix="mqbatch-spark-stopping-", suffix=".log")
            with os.fdopen(fd, "wb") as f:
                f.writelines(held)
            where = f"; what they printed while stopping ({len(held)} lines): {path}"
        print(
            f"mqbatch spark: stopped by {signal.Signals(received[0]).name}; spark-submit and its children ended{where}",
            file=sys.stderr,
        )
        return 128 + received[0]
    return code
