"""The job must use the master spark-submit was given (a cluster), never silently fall
back to local[*]: a SparkConf made before the JVM exists cannot see spark-submit's
settings. (Seen for real: submitted to a standalone master, the job ran locally.)"""

import os
import subprocess
import sys

import pytest

from mqbatch.util.paths import ROOT
from mqbatch_testing import VENV_BIN

pytestmark = pytest.mark.spark


def test_job_session_takes_spark_submits_master(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'spark_jobs')!r})\n"
        "import telemetry_job\n"
        "spark = telemetry_job.session()\n"
        "print('MASTER=' + spark.sparkContext.master)\n"
        "spark.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=str(ROOT / "host"))
    proc = subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false", str(probe)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MASTER=local[1]" in proc.stdout, proc.stdout[-2000:]


def test_the_jobs_sessions_let_a_micro_batch_go_before_work_beside_the_stream(tmp_path):
    """Issue 24: the report beside the stream (mqbatch.spark.beside) takes the cores the
    micro-batches leave idle only where the session schedules FAIR with the job's pools:
    `mqbatch spark` passes them to spark-submit, job.session sets them when it starts the
    JVM, and a user's own spark.scheduler.mode is left as it is."""
    import argparse
    import pathlib
    import textwrap

    from mqbatch.spark import beside, options, submit

    pools = {
        p.get("name"): p
        for p in __import__("xml.etree.ElementTree").etree.ElementTree.parse(beside.SCHEDULER_XML).getroot()
    }
    assert set(pools) == {"default", beside.POOL}
    assert int(pools["default"].findtext("minShare")) > 10_000 and int(pools[beside.POOL].findtext("minShare")) == 0
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(["--landing", str(tmp_path), "--out", str(tmp_path / "out"), "--stream"])
    args.master, args.spark_conf_args = None, []
    cmd = submit.submit_command(args, tmp_path / "mqbatch.zip", None)
    confs = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--conf"]
    assert (
        "spark.scheduler.mode=FAIR" in confs
        and f"spark.scheduler.allocation.file={beside.SCHEDULER_XML.as_uri()}" in confs
    )
    args.spark_conf_args = ["--conf", "spark.scheduler.mode=FIFO"]
    confs = [x for x in submit.submit_command(args, tmp_path / "mqbatch.zip", None) if x.startswith("spark.scheduler")]
    assert confs == ["spark.scheduler.mode=FIFO"], confs
    assert pathlib.Path(beside.SCHEDULER_XML).is_file()

    probe = tmp_path / "probe.py"
    probe.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'host')!r})\n"
        + textwrap.dedent("""
            from mqbatch.spark import job
            sc = job.session().sparkContext
            print('MODE=' + sc.getConf().get('spark.scheduler.mode'))
            pools, it = [], sc._jsc.sc().getAllPools().iterator()
            while it.hasNext():
                pools.append(f'{(p := it.next()).name()}:{p.minShare()}')
            print('POOLS=' + ','.join(sorted(pools)))
            sc.stop()
        """)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MODE=FAIR" in proc.stdout and f"POOLS=default:100000,{beside.POOL}:0" in proc.stdout, proc.stdout
