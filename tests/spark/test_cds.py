"""The JVM's class-data archive (mqbatch.spark.cds): which options a JVM gets, when an
archive is written and kept, and that the check the Spark tests rely on (-Xshare:on: the
JVM refuses to start unless it maps the archive) fails on an archive that does not fit.
That a real `mqbatch spark` maps the archive `make test` wrote (spark-prepare, which is
`mqbatch spark --prepare`) is checked by test_spark_cli.py's clean-shell run, and the shared
session's JVM by test_spark_job.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from mqbatch.spark import cds, jvm
from mqbatch_testing import VENV_BIN
from mqbatch_testing.spark import cds_archive


@pytest.fixture
def spark_home(tmp_path, monkeypatch):
    """A SPARK_HOME whose jars/ the test controls, an empty archive folder, no options of the caller."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core_2.13-4.0.1.jar").write_bytes(b"core")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv(cds.ENV, str(tmp_path / "cds"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    if cds.archive() is None:
        pytest.skip("no java on PATH or in JAVA_HOME: mqbatch.spark.cds gives no options without one")
    return jars


@pytest.fixture
def real_archive():
    """This checkout's archive, found before a test points mqbatch.spark.cds elsewhere."""
    return cds_archive()


def test_the_archive_name_follows_the_jars_and_off_means_none(spark_home, monkeypatch):
    first = cds.archive()
    assert first.parent == spark_home.parents[1] / "cds" and cds.archive() == first
    (spark_home / "spark-core_2.13-4.0.1.jar").write_bytes(b"core, rebuilt")  # another size
    assert cds.archive() != first
    monkeypatch.setenv(cds.ENV, "off")
    assert cds.archive() is None and cds.map_options() == []
    with pytest.raises(cds.CdsError, match="MQBATCH_JVM_CDS=off"):
        cds.write_options()


def test_write_then_map_and_the_callers_own_choice_wins(real_archive, spark_home):
    path = cds.archive()
    assert cds.map_options() == []  # none written yet
    options, pending, lock = cds.write_options()
    assert options == [f"-XX:ArchiveClassesAtExit={pending}", cds.WRITE_LOG] and pending.name == path.name + ".tmp"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    shutil.copyfile(real_archive, pending)  # as the JVM writes it at its exit
    assert cds.finish(pending, lock, ok=True) is None
    assert path.is_file() and not pending.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
    assert cds.map_options() == [f"-XX:SharedArchiveFile={path}", cds.QUIET]
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "'unbalanced"):
        assert cds.map_options(f"-Xmx2g {own}") == [], own
    os.chmod(path.parent, 0o777)  # a folder others can write: its archive is not mapped (it is code)
    assert cds.map_options() == []
    os.chmod(path.parent, 0o700)
    with open(path, "r+b") as f:  # cut in place (a disk fault): the JVM would crash on it
        f.truncate(path.stat().st_size // 2)
    assert cds.map_options() == []


def test_a_failed_run_a_silent_jvm_and_a_cut_archive_are_never_put_in_place(real_archive, spark_home):
    """A JVM that maps a cut archive crashes (SIGBUS) or refuses it: finish() keeps none, and says why."""
    path = cds.archive()
    cases = [(False, 1 << 20, "the run failed"), (True, 0, "the JVM wrote no archive")]
    cases += [(True, n, "a JVM does not start with what it wrote") for n in (1 << 20, real_archive.stat().st_size // 2)]
    for ok, size, why in cases:
        _, pending, lock = cds.write_options()
        with open(real_archive, "rb") as src:
            pending.write_bytes(src.read(size))
        assert (cds.finish(pending, lock, ok=ok) or "").startswith(why), (ok, size)
        assert not pending.exists() and not path.exists()


def test_one_writer_at_a_time_and_what_a_dead_one_left_goes(spark_home):
    path = cds.archive()
    path.parent.mkdir(mode=0o700)
    left = path.with_name(path.name + ".tmp")
    left.write_bytes(b"of a prepare that was killed")
    _, pending, lock = cds.write_options()
    assert pending == left and not pending.exists()  # removed: no writer held the lock
    with pytest.raises(cds.CdsError, match="another `mqbatch spark --prepare` is writing"):
        cds.write_options()
    assert cds.finish(pending, lock, ok=False) == "the run failed"
    _, pending, lock = cds.write_options()  # the lock is free again
    cds.finish(pending, lock, ok=False)


def test_the_folder_keeps_the_newest_archives(real_archive, spark_home):
    path = cds.archive()
    path.parent.mkdir(mode=0o700)
    old = [path.parent / f"spark-{i:016x}.jsa" for i in range(cds.KEEP)]
    for age, p in enumerate(old):
        p.write_bytes(b"an older installation's")
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    _, pending, lock = cds.write_options()
    shutil.copyfile(real_archive, pending)
    assert cds.finish(pending, lock, ok=True) is None
    assert sorted(path.parent.glob("spark-*.jsa")) == sorted([path, *old[1:]])  # the oldest went


def test_a_class_path_folder_with_files_or_the_callers_sharing_writes_no_archive(spark_home, tmp_path, monkeypatch):
    conf = spark_home.parent / "conf"  # $SPARK_HOME/conf: spark-submit's class path when SPARK_CONF_DIR is unset
    conf.mkdir()
    cds.finish(*cds.write_options()[1:], ok=False)  # an empty folder does not stop the JVM
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    with pytest.raises(cds.CdsError, match="holds files and is on the JVM's class path"):
        cds.write_options()
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xshare:off")
    with pytest.raises(cds.CdsError, match="SPARK_SUBMIT_OPTS choose class-data sharing"):
        cds.write_options()


def test_options_come_first_so_the_callers_own_win_and_survive_spark_submits_parsing():
    joined = cds.with_options(["-XX:SharedArchiveFile=/a b/c.jsa", cds.QUIET], "-Dlog4j2.configurationFile=mine")
    assert shlex.split(joined) == ["-XX:SharedArchiveFile=/a b/c.jsa", cds.QUIET, "-Dlog4j2.configurationFile=mine"]
    assert cds.with_options([], None) == ""


def test_xshare_on_refuses_an_archive_that_does_not_fit(real_archive, tmp_path):
    """The instrument of the Spark tests: with -Xshare:on a JVM that cannot map its archive does
    not start. Shown on this checkout's archive (written for Spark's class path, so it does not
    fit a JVM without it) and on a cut copy; the archive itself starts a JVM with the class
    path it was written for (test_spark_cli.py's clean-shell run)."""
    damaged = tmp_path / "damaged.jsa"
    with open(real_archive, "rb") as src:
        damaged.write_bytes(src.read(1 << 20))
    for path in (real_archive, damaged):
        proc = subprocess.run(
            [str(jvm.jdk_tool("java")), "-Xshare:on", f"-XX:SharedArchiveFile={path}", cds.QUIET]
            + ["-XX:-CreateCoredumpOnCrash", "-XX:ErrorFile=/dev/null", "-version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, proc
        if path == real_archive:
            assert "Unable to use shared archive" in proc.stdout + proc.stderr, proc


@pytest.mark.parametrize(
    "argv,line,code",
    [
        (["--out", "out"], "mqbatch spark: the following arguments are required: --landing (or --prepare)", 2),
        (
            ["--prepare", "--stream", "--landing", "l"],
            "mqbatch spark: --prepare takes no --landing, --stream (it runs locally over its own data)",
            2,
        ),
    ],
)
def test_mqbatch_spark_paths_and_prepare_flags_are_checked_first(tmp_path, argv, line, code):
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "spark", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == code and proc.stderr.strip().splitlines()[-1] == line, proc.stderr
    assert not (tmp_path / "out").exists()
