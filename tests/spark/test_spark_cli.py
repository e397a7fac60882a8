"""`mqbatch spark` as a user runs it (issues 11, 13, 14): a printed command that runs from
a clean shell, quiet logs, arguments checked before the JVM, signals that end the whole
spark-submit process group, and a streaming job that gives the same output after a
SIGKILL and a restart. Plus the example of a user's own job (spark_jobs/example_partitioned.py)."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest
from test_spark_job import expected_report, scenario_files
from test_spark_outputs import not_utc_micros

from mqbatch_testing import VENV_BIN
from mqbatch_testing.spark import cds_archive, clean_env, write_landing

pytestmark = pytest.mark.spark
MQBATCH = str(VENV_BIN / "mqbatch")
SMALL = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"]


@pytest.fixture(scope="module")
def scenario_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-scenario")
    for segment, rows in enumerate(scenario_files()):
        write_landing(d, "r1", segment, rows)
    return d


# -- arguments are checked before any JVM starts ------------------------------------------


def test_the_command_imports_neither_pyspark_nor_pandas_before_spark_submit(tmp_path):
    """`mqbatch spark` checks its arguments and the checkpoint, builds the command, then runs
    spark-submit; the job imports pyspark there. The command itself imported pyspark and
    pandas (through the stream module for its checkpoint check): 1.3-1.6 s of CPU before every
    run, now ~0.7 s in all. Checked after the command was built (--print-command) and the
    JVM options chosen (cds.map_options), with no SPARK_HOME: the jars are found, not imported."""
    (tmp_path / "landing").mkdir()
    code = (
        "import sys\n"
        "from mqbatch import cli\n"
        "from mqbatch.spark import cds\n"
        "argv = ['spark', '--landing', 'landing', '--out', 'out', '--print-command', '--pyfiles-zip', 'm.zip']\n"
        "assert cli.main(argv) == 0\n"
        "cds.map_options(None)\n"
        "print(sorted({'pyspark', 'pandas', 'numpy'} & set(sys.modules)), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_CONF_DIR")}
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr[-3000:]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--landing", "/nonexistent/landing", "--out", "OUT"], "is not a directory"),
        (["--landing", ".", "--out", "OUT", "--reorder-window", "-1"], "must be >= 0"),
        (["--landing", ".", "--out", "OUT", "--log-level", "LOUD"], "invalid choice"),
        (["--landing", ".", "--out", "OUT", "--stream", "--once"], "not allowed with"),
    ],
)
def test_bad_arguments_fail_before_spark_starts(tmp_path, argv, message):
    proc = subprocess.run([MQBATCH, "spark", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode != 0 and message in proc.stderr
    assert "spark" not in proc.stdout.lower() and "log4j" not in proc.stderr and "SparkContext" not in proc.stderr
    assert not (tmp_path / "OUT").exists()


# -- the printed command, in a clean shell ---------------------------------------------------


def test_printed_command_runs_in_a_clean_shell_quietly(tmp_path):
    """env -i: no venv on PATH, no SPARK_HOME, no PYSPARK_PYTHON. An empty landing zone
    (which used to end in RejectedExecutionException errors at shutdown)."""
    (tmp_path / "landing").mkdir()
    # and its JVM maps the class-data archive `make test` wrote (mqbatch.spark.cds): with
    # -Xshare:on a JVM that cannot map it does not start (test_cds.py shows one that does not fit)
    # (a printed command maps no archive of its own: it may run on another machine; the
    # caller's SPARK_SUBMIT_OPTS, here the tests' with the archive, go into it)
    archive = cds_archive(skip=False)
    mapped = archive is not None
    opts = os.environ["SPARK_SUBMIT_OPTS"] + (" -Xshare:on" if mapped else "")
    dry = subprocess.run(
        [
            MQBATCH,
            "spark",
            "--landing",
            "landing",
            "--out",
            "out",
            *SMALL,
            "--print-command",
            "--pyfiles-zip",
            str(tmp_path / "mqbatch.zip"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, SPARK_SUBMIT_OPTS=opts),
    )
    assert dry.returncode == 0, dry.stderr
    line = dry.stdout.strip()
    assert line.startswith("env ") and "SPARK_HOME=/" in line and "PYSPARK_PYTHON=/" in line
    assert (f"-XX:SharedArchiveFile={archive}" in line) == mapped, line
    proc = subprocess.run(
        ["/bin/sh", "-c", line], env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 landed PUBLISHes, 0 records" in proc.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["landed"] == 0 and report["devices"] == {}
    assert "Exception" not in proc.stderr and " INFO " not in proc.stderr, proc.stderr[-3000:]


# -- signals ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out


def _group(pgid: int) -> list[int]:
    """Live processes of a process group (zombies excluded)."""
    members = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _wait_for_child(proc: subprocess.Popen, *words: str, timeout: float = 300) -> int:
    """The pid of proc's first child whose command line holds one of `words`, once there is one."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before a child running {words} was seen"
        assert time.monotonic() < deadline, f"no child running {words} after {timeout} s"
        for kid in _children(proc.pid):
            if any(w in _cmdline(kid) for w in words):
                return kid
        threading.Event().wait(0.02)


class Job:
    """`mqbatch spark ...` in its own session, stdout read line by line."""

    def __init__(self, argv, cwd, env=None):
        self.proc = subprocess.Popen(
            [MQBATCH, "spark", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            start_new_session=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, *needles, timeout=600) -> str:
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"job ended before {needles}: {self.seen[-20:]} {self.proc.stderr.read()[-3000:]}")
            self.seen.append(line)
            if any(n in line for n in needles):
                return line

    def spark_group(self) -> int:
        """The process group of the spark-submit child (its own session)."""
        kids = _children(self.proc.pid)
        assert kids, "mqbatch spark has no child"
        return kids[0]


def test_sighup_ends_spark_submit_and_everything_it_started(tmp_path, scenario_dir):
    """SIGHUP while the JVM starts; SIGTERM while the job streams is the end of
    test_sigkill_of_mqbatch_spark_stream_... (one JVM fewer in `make test`)."""
    job = Job(
        ["--landing", str(scenario_dir), "--out", str(tmp_path / "out"), "--stream", "--trigger-seconds", "1", *SMALL],
        tmp_path,
    )
    # the JVM starting (the script, or java once it exec'd; not javac building the fast path's jar)
    _wait_for_child(job.proc, "spark-submit", "org.apache.spark.deploy.SparkSubmit")
    pgid = job.spark_group()
    os.kill(job.proc.pid, signal.SIGHUP)
    assert job.proc.wait(timeout=120) == 128 + signal.SIGHUP
    assert _group(pgid) == [], "processes left behind by spark-submit"


def test_sighup_while_javac_builds_the_fast_path_ends_with_one_line(tmp_path, scenario_dir):
    """A stop signal before spark-submit exists (here: while javac compiles the JVM fast
    path into an empty cache) ends the command with 128+signal and one line, javac gone
    too: not the default action's silent death (CI saw exit -1 from this window)."""
    job = Job(
        ["--landing", str(scenario_dir), "--out", str(tmp_path / "out"), *SMALL],
        tmp_path,
        env=dict(os.environ, MQBATCH_JVM_CACHE=str(tmp_path / "cache")),  # nothing cached: javac runs
    )
    javac = _wait_for_child(job.proc, "javac")
    os.kill(job.proc.pid, signal.SIGHUP)
    assert job.proc.wait(timeout=60) == 128 + signal.SIGHUP
    err = job.proc.stderr.read()
    assert "mqbatch spark: stopped by SIGHUP before spark-submit started" in err, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 10
    while _cmdline(javac) and time.monotonic() < deadline:
        threading.Event().wait(0.1)
    assert not _cmdline(javac), "javac outlived the stopped command"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- streaming: SIGKILL at a random moment of a micro-batch, restart, same output ------------


@pytest.mark.slow
@pytest.mark.long  # 197 s in CI; make test kills a stream with SIGKILL and restarts it in test_sigkill_of_...
def test_stream_killed_mid_batch_then_restarted_gives_the_uninterrupted_output(spark, tmp_path, scenario_dir):
    import mqbatch.spark as S

    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    shutil.copy(scenario_dir / "landing-r1-00000000.parquet", landing)
    job = Job(
        [
            "--landing",
            str(landing),
            "--out",
            str(out),
            "--stream",
            "--trigger-seconds",
            "1",
            "--reorder-window",
            "3",
            *SMALL,
        ],
        tmp_path,
    )
    job.wait_for("batch 0: 1 files")
    shutil.copy(scenario_dir / "landing-r1-00000001.parquet", landing / ".new.tmp")
    os.replace(landing / ".new.tmp", landing / "landing-r1-00000001.parquet")
    job.wait_for("batch 1: started")
    pgid = job.spark_group()
    os.killpg(pgid, signal.SIGKILL)  # power cut: nothing runs any handler
    os.killpg(job.proc.pid, signal.SIGKILL)
    job.proc.wait(timeout=60)
    # SIGKILL is delivered at once but a JVM takes a moment to die, on a loaded machine more:
    # until it has, it still holds the checkpoint's lock, and the restart is rightly refused
    deadline = time.monotonic() + 60
    while _group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group(pgid), f"the killed job's processes are still alive after 60 s: {_group(pgid)}"
    print(f"killed during batch 1; committed before the kill: {sorted(p.name for p in (out / '_batches').glob('*'))}")

    report = S.run_stream(spark, str(landing), str(out), S.JobOptions(reorder_window=3))  # the restart
    assert report == expected_report(False)
    batch = tmp_path / "batch"
    S.run_batch(spark, str(landing), str(batch), S.JobOptions(reorder_window=3))
    cols = ["device", "boot", "seq", "batch_id", "sub_index", "received_at", "readings", "date"]
    for name, order in (("records", ["device", "boot", "seq"]), ("quarantine", ["segment", "offset", "sub_index"])):
        got = spark.read.parquet(str(out / name)).orderBy(*order).collect()
        want = spark.read.parquet(str(batch / name)).orderBy(*order).collect()
        keep = cols if name == "records" else [c for c in want[0].asDict() if c != "date"]
        assert [{k: r[k] for k in keep} for r in got] == [{k: r[k] for k in keep} for r in want], name
    assert sorted(p.name for p in (out / "records").iterdir()) == ["date=2026-11-18"]
    assert not list(out.glob("_staging/*"))


# -- your own job -------------------------------------------------------------------------


def test_example_job_writes_readings_partitioned_by_date_and_device(spark, tmp_path, scenario_dir):
    import example_partitioned  # spark_jobs/ is on sys.path once the `spark` fixture ran

    example_partitioned.build(spark, str(scenario_dir), str(tmp_path))
    parts = sorted(str(p.relative_to(tmp_path / "readings")) for p in (tmp_path / "readings").glob("date=*/device=*"))
    assert parts == ["date=2026-11-18/device=dev-a", "date=2026-11-18/device=dev-b"]
    rows = spark.read.parquet(str(tmp_path / "readings")).collect()
    assert len(rows) == 2 * expected_report(False)["records"]["unique"]  # two readings per sample record
    assert {(r.device, r.channel) for r in rows if r.kind == "sample"} >= {
        ("dev-a", "temperature"),
        ("dev-b", "supply_voltage"),
    }
    assert spark.read.parquet(str(tmp_path / "rejected")).count() == expected_report(False)["quarantine"]["rows"]
    for table in ("readings", "rejected"):  # UTC microseconds, as the job's own outputs (issue 26.9)
        assert not_utc_micros(tmp_path / table) == [], table


# -- streaming: one job per checkpoint ----------------------------------------------------

HELD = "another job is streaming with the checkpoint {} (its .lock is held); stop it first or give --checkpoint another folder"


def test_a_held_checkpoint_is_refused_by_the_command_and_by_the_job_before_a_jvm_starts(tmp_path, capsys):
    """`mqbatch spark --stream` refuses a checkpoint another job holds before spark-submit
    starts a JVM; the job (spark-submit by hand) refuses it before its SparkContext. The
    command's check lets the lock go, so the job it starts can take it."""
    import fcntl

    from mqbatch import cli
    from mqbatch.spark import checkpoint as ckpt
    from mqbatch.spark import job

    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    checkpoint = out / "_checkpoint"
    ckpt.check_checkpoint_free(str(out), None)  # free: checked, created, let go
    assert (checkpoint / ".lock").is_file() and oct(out.stat().st_mode & 0o777) == "0o700"
    fd = os.open(checkpoint / ".lock", os.O_RDWR)  # another job's lock (its own open file)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the check had kept it
        argv = ["--landing", str(landing), "--out", str(out), "--stream"]
        assert cli.main(["spark", *argv]) == 1
        assert capsys.readouterr().err.splitlines() == ["mqbatch spark: " + HELD.format(checkpoint)]
        for mode in ("--stream", "--once"):
            with pytest.raises(SystemExit, match="^telemetry_job: " + re.escape(HELD.format(checkpoint)) + "$"):
                job.main(["--landing", str(landing), "--out", str(out), mode])
    finally:
        os.close(fd)
    key = os.path.realpath(checkpoint)
    ckpt.lock_checkpoint(str(checkpoint))  # held by this process already: the check keeps it
    try:
        ckpt.check_checkpoint_free(str(out), None)
        assert key in ckpt._HELD
        other = os.open(checkpoint / ".lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        os.close(ckpt._HELD.pop(key))


def test_a_checkpoint_that_is_a_file_or_a_url_is_refused_in_one_line(tmp_path):
    """Before: a traceback (NotADirectoryError) and the file chmod-ed to 0700; a URL made a
    local folder named `hdfs:`."""
    from mqbatch import cli

    landing, out, a_file = tmp_path / "landing", tmp_path / "out", tmp_path / "notes.txt"
    landing.mkdir()
    a_file.write_text("not a folder\n")
    a_file.chmod(0o644)
    argv = ["spark", "--landing", str(landing), "--out", str(out), "--once", "--checkpoint"]
    with pytest.raises(
        SystemExit, match=f"^mqbatch spark: --checkpoint '{re.escape(str(a_file))}' exists and is not a directory$"
    ):
        cli.main([*argv, str(a_file)])
    assert oct(a_file.stat().st_mode & 0o777) == "0o644"
    with pytest.raises(SystemExit, match="^mqbatch spark: --checkpoint must be a local folder"):
        cli.main([*argv, "hdfs://namenode/checkpoints/telemetry"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["landing", "notes.txt"]


def test_commits_of_another_checkpoint_are_refused_not_skipped_as_already_committed(tmp_path, capsys):
    """Spark numbers micro-batches per checkpoint: a new (or emptied) checkpoint on an --out with
    commits started again at batch 0, and every batch whose id had a commit was skipped as
    "already committed": its files never processed. Now refused in one line, before a JVM."""
    from mqbatch import cli
    from mqbatch.spark import checkpoint as ckpt

    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    first = out / "_checkpoint"
    ckpt.check_same_checkpoint(str(out), str(first))  # a new stream: its checkpoint's id noted
    ck_id = (first / ckpt.STREAM_ID).read_text()
    assert len(ck_id.strip()) == 32 and (out / ckpt.STREAM_CHECKPOINT).read_text() == ck_id
    (out / "_batches").mkdir()
    (out / "_batches" / "0000000000.json").write_text("{}")  # batch 0 committed ...
    (first / "landing" / "offsets").mkdir(parents=True)
    (first / "landing" / "offsets" / "0").write_text("v1")  # ... by the stream of this checkpoint
    ckpt.check_same_checkpoint(str(out), str(first))  # its restart: fine

    argv = ["spark", "--landing", str(landing), "--out", str(out), "--once"]
    other = tmp_path / "elsewhere"
    shutil.copytree(first / "landing", other / "landing")  # another stream's state
    assert cli.main([*argv, "--checkpoint", str(other)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"mqbatch spark: --out {out} holds the commits of another stream's checkpoint, not of {other}: "
        "give that stream's --checkpoint, or another --out"
    ]
    moved = tmp_path / "moved"  # --out moved with its checkpoint inside: still its own
    out.rename(moved)
    ckpt.check_same_checkpoint(str(moved), str(moved / "_checkpoint"))
    shutil.rmtree(moved / "_checkpoint")  # the stream's own checkpoint, emptied
    assert cli.main(["spark", "--landing", str(landing), "--out", str(moved), "--once"]) == 1
    assert "has no stream state (new or emptied)" in capsys.readouterr().err
    (moved / ckpt.STREAM_CHECKPOINT).unlink()  # an --out written before the note existed: the same
    with pytest.raises(SystemExit, match="has no stream state"):
        ckpt.check_same_checkpoint(str(moved), str(moved / "_checkpoint"))
    assert not (other / ckpt.STREAM_ID).exists()  # ... and a checkpoint with state is adopted
    ckpt.check_same_checkpoint(str(moved), str(other))
    assert (moved / ckpt.STREAM_CHECKPOINT).read_text() == (other / ckpt.STREAM_ID).read_text() != ck_id


# -- streaming: SIGKILL of the command itself (issue 22.4) ---------------------------------


def test_sigkill_of_mqbatch_spark_stream_leaves_no_jvm_and_the_restart_reports_at_once(tmp_path, scenario_dir):
    """SIGKILL to `mqbatch spark --stream` (no handler runs) left its JVM streaming in its own
    session, and a restarted job died with CONCURRENT_STREAM_LOG_UPDATE; a kill between a
    batch's commit and its report left report.json stale until new data came. Now the JVM
    dies with the command (PR_SET_PDEATHSIG) and the job's Python driver with the JVM, a
    second stream on the same checkpoint is refused in one line, and a restart rewrites
    report.json (and the HTML report) from the committed state before its first micro-batch."""
    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    shutil.copy(scenario_dir / "landing-r1-00000000.parquet", landing)
    argv = ["--landing", str(landing), "--out", str(out), "--stream", "--trigger-seconds", "1"]
    argv += ["--reorder-window", "3", *SMALL]
    job = Job(argv, tmp_path)
    try:
        job.wait_for("batch 0: 1 files")  # committed, and its report written
        want = json.loads((out / "report.json").read_text())
        assert want["landed"] == 6 and want["records"]["unique"] == 8

        # refused in one line by mqbatch spark itself, before spark-submit starts a JVM (the
        # job's own refusal, for a spark-submit run by hand: test_the_job_refuses_a_held_checkpoint...)
        second = subprocess.run([MQBATCH, "spark", *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert second.returncode == 1, second.stderr[-3000:]
        assert second.stderr.splitlines() == [
            f"mqbatch spark: another job is streaming with the checkpoint {out}/_checkpoint (its .lock is held); "
            "stop it first or give --checkpoint another folder"
        ], second.stderr[-3000:]
    except BaseException:
        job.proc.kill()  # a failed check leaves no stream behind (the JVM dies with the command)
        raise

    pgid = job.spark_group()
    os.kill(job.proc.pid, signal.SIGKILL)  # the command only: its children get no signal from us
    job.proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while _group(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _group(pgid) == [], "the JVM (or its children) outlived mqbatch spark"

    (out / "report.json").write_text('{"stale": true}\n')  # as if killed between commit and report
    (out / "report.html").unlink(missing_ok=True)
    restarted = Job(argv, tmp_path)
    try:
        restarted.wait_for("telemetry_job: streaming")  # no new data: no micro-batch will run
        assert json.loads((out / "report.json").read_text()) == want
        deadline = time.monotonic() + 120
        while not (out / "report.html").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert (out / "report.html").is_file(), "the restart wrote no HTML report"
        tmp = landing / ".landing-r1-00000001.parquet.tmp"  # as the recorder lands a file: rename into place
        shutil.copy(scenario_dir / "landing-r1-00000001.parquet", tmp)
        os.replace(tmp, landing / "landing-r1-00000001.parquet")
        restarted.wait_for("batch 1: 1 files")  # new data: the Python driver and its workers run
        assert json.loads((out / "report.json").read_text()) == expected_report(False)
    finally:
        pgid = restarted.spark_group()
        os.kill(restarted.proc.pid, signal.SIGTERM)  # while streaming: the job stops, then its JVM
        assert restarted.proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert _group(pgid) == [], "processes left behind by spark-submit after SIGTERM"
    assert "CONCURRENT_STREAM_LOG_UPDATE" not in restarted.proc.stderr.read()
