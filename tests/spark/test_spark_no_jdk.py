"""`mqbatch spark` without a working JDK (issue 24): no javac on PATH, or a javac that
fails. The JVM fast path cannot be built; the job must decode everything with the Python
decoders, say so once, and give the same report (it used to crash with NotADirectoryError:
the driver's warning re-read BatchDecoder.java from inside the --py-files zip)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from test_spark_job import STEPS, expected_report, scenario_files
from test_spark_outputs import not_private, not_utc_micros

from mqbatch_testing import VENV_BIN
from mqbatch_testing.spark import path_without_javac, write_landing

pytestmark = pytest.mark.spark
SMALL = ["--master", "local[2]", "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"]


def failing_javac(directory: pathlib.Path) -> str:
    directory.mkdir()
    javac = directory / "javac"
    javac.write_text("#!/bin/sh\necho 'error: this javac is broken on purpose' >&2\nexit 3\n")
    javac.chmod(0o755)
    return f"{directory}:/usr/bin:/bin"


def _env(tmp_path, path: str) -> dict:
    drop = ("JAVA_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # no jar cached anywhere; no help from the test process's Python variables: the venv's
    # console script finds mqbatch as installed, and the command ships it with --py-files
    env.update(PATH=path, MQBATCH_JVM_CACHE=str(tmp_path / "jvm-cache"))
    return env


def test_without_javac_under_umask_022_the_command_decodes_in_python_with_private_outputs(tmp_path):
    """End to end through spark-submit (its own JVM), as a user runs the command: the case
    that crashed. No help from the test process's Python variables, started under umask 022:
    the same report as the fast path, the note said once, the summary line, one progress
    line per step on stderr with its seconds, the HTML report next to report.json,
    everything 0700/0600, every timestamp UTC microseconds (issues 23.4, 26.9)."""
    landing = tmp_path / "landing"
    for segment, rows in enumerate(scenario_files()):
        write_landing(landing, "r1", segment, rows)
    env = _env(tmp_path, path_without_javac(tmp_path / "bin"))
    assert subprocess.run(["sh", "-c", "command -v javac"], env=env, capture_output=True).returncode != 0
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "spark", "--landing", str(landing), "--out", str(out)]
        + ["--reorder-window", "3", *SMALL, "--html"],
        capture_output=True,
        text=True,
        timeout=600,
        umask=0o022,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "report.json").read_text()) == expected_report(False)
    notes = [line for line in proc.stderr.splitlines() if "fast path is off" in line]
    assert len(notes) == 1 and "no javac (a JDK) found" in notes[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]
    assert "12 landed PUBLISHes, 16 records (2 duplicates), 6 quarantined" in proc.stdout, proc.stdout[-2000:]
    steps = [line for line in proc.stderr.splitlines() if line.startswith("spark: ")]
    names = [line.removeprefix("spark: ").rsplit(" ", 2)[0] for line in steps]
    assert names == STEPS, proc.stderr[-3000:]
    assert all(line.endswith(" s") and float(line.rsplit(" ", 2)[1]) >= 0 for line in steps)
    assert (out / "report.html").is_file() and f"HTML report {out / 'report.html'}" in proc.stderr
    assert not_private(out) == []
    for table in ("records", "quarantine"):
        assert not_utc_micros(out / table) == []


def test_with_a_failing_javac_the_command_ships_no_jar_and_says_why_once(tmp_path):
    """javac exits 3: no jar, one line with javac's complaint, and the submitted job is told
    that it was said (it then decodes in Python exactly as without javac, above)."""
    env = _env(tmp_path, failing_javac(tmp_path / "bin"))
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "spark", "--landing", "L", "--out", "O", "--print-command"]
        + ["--pyfiles-zip", str(tmp_path / "mqbatch.zip")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--jars" not in proc.stdout and "MQBATCH_JVM_FAST_PATH_OFF=1" in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "fast path is off" in line]
    assert len(notes) == 1, proc.stderr
    assert "javac failed (exit 3): error: this javac is broken on purpose" in notes[0]
    assert not (tmp_path / "jvm-cache").exists() or not any((tmp_path / "jvm-cache").glob("*.jar"))


def test_a_driver_without_the_java_source_gets_none_not_a_crash(tmp_path, monkeypatch, capsys):
    """The driver under spark-submit imports mqbatch from the --py-files zip: SOURCE is a
    path inside a file. jar() used to raise NotADirectoryError there."""
    from mqbatch.spark import jvm

    (tmp_path / "mqbatch.zip").write_bytes(b"PK")
    monkeypatch.setattr(jvm, "SOURCE", tmp_path / "mqbatch.zip" / "mqbatch" / "spark" / "java" / "BatchDecoder.java")
    monkeypatch.setattr(jvm, "_notes", set())
    assert jvm.jar() is None
    assert "the JVM fast path is off: its source cannot be read here (NotADirectoryError" in capsys.readouterr().err
