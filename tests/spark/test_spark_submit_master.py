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
