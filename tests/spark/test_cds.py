"""The JVM's class-data archive (mqbatch.spark.cds): which options a JVM gets, when an
archive is written and kept, and that the check the Spark tests rely on (-Xshare:on: the
JVM refuses to start unless it maps the archive) fails on an archive that does not fit.
That a real `mqbatch spark` maps the archive `make test` wrote is checked by
test_spark_cli.py's clean-shell run, and the shared session's JVM by test_spark_job.py."""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

from mqbatch.spark import cds


@pytest.fixture
def spark_home(tmp_path, monkeypatch):
    """A SPARK_HOME whose jars/ the test controls, and an empty archive folder."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core_2.13-4.0.1.jar").write_bytes(b"core")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv(cds.ENV, str(tmp_path / "cds"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    if cds.java() is None:
        pytest.skip("no java on PATH or in JAVA_HOME: mqbatch.spark.cds gives no options without one")
    return jars


def test_the_archive_name_follows_the_jars_and_off_means_none(spark_home, monkeypatch):
    first = cds.archive()
    assert first is not None and first.parent == spark_home.parents[1] / "cds"
    assert cds.archive() == first  # the same installation: the same name
    (spark_home / "spark-core_2.13-4.0.1.jar").write_bytes(b"core, rebuilt")  # another size
    assert cds.archive() != first
    monkeypatch.setenv(cds.ENV, "off")
    assert cds.archive() is None and cds.java_options(create=True) == ([], None)


def test_options_map_an_archive_or_write_one_only_when_asked(spark_home):
    path = cds.archive()
    assert cds.java_options() == ([], None)  # none yet, not asked to write one
    options, pending = cds.java_options(create=True)
    assert options == [f"-XX:ArchiveClassesAtExit={pending}", cds.QUIET]
    assert pending.parent == path.parent and pending.name == f"{path.name}.{os.getpid()}.tmp"
    shutil.copyfile(_checkout_archive(), pending)  # as the JVM writes it at its exit
    assert cds.finish(pending, ok=True) == path and path.stat().st_size > 0 and not pending.exists()
    assert cds.java_options(create=True) == ([f"-XX:SharedArchiveFile={path}", cds.QUIET], None)


CHECKOUT_ARCHIVE = cds.archive()  # this checkout's, before a test points cds elsewhere


def _checkout_archive() -> pathlib.Path:
    archive = CHECKOUT_ARCHIVE
    if archive is None or not archive.is_file():
        pytest.skip(f"no class-data archive at {archive}: `make test` writes it first (make spark-prepare)")
    return archive


def test_a_cut_archive_is_never_put_in_place(spark_home):
    """A JVM that maps a cut archive crashes (SIGBUS) or refuses it: finish() keeps neither."""
    good = _checkout_archive()
    path = cds.archive()
    for size in (1 << 20, good.stat().st_size // 2, 0):
        _, pending = cds.java_options(create=True)
        with open(good, "rb") as src:
            pending.write_bytes(src.read(size))
        assert not cds.loads(pending)
        assert cds.finish(pending, ok=True) is None and not pending.exists() and not path.exists()


def test_a_failed_run_keeps_no_archive_and_abandoned_ones_are_removed(spark_home):
    path = cds.archive()
    _, pending = cds.java_options(create=True)
    pending.write_bytes(b"an archive of a run that failed")
    assert cds.finish(pending, ok=False) is None and not pending.exists() and not path.exists()
    _, pending = cds.java_options(create=True)
    assert cds.finish(pending, ok=True) is None and not path.exists()  # the JVM wrote nothing
    dead = subprocess.Popen(["true"])
    dead.wait()
    abandoned = path.with_name(f"{path.name}.{dead.pid}.tmp")
    running = path.with_name(f"{path.name}.{os.getppid()}.tmp")  # a run still going
    abandoned.write_bytes(b"x")
    running.write_bytes(b"x")
    cds.java_options(create=True)
    assert not abandoned.exists() and running.exists()


def test_a_spark_conf_dir_with_files_writes_no_archive(spark_home, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert cds.java_options(create=True)[1] is not None  # an empty folder does not stop the JVM
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    assert cds.java_options(create=True) == ([], None)


def test_options_survive_spark_submits_parsing_with_spaces_in_paths():
    joined = cds.with_options("-XX:TieredStopAtLevel=1", ["-XX:SharedArchiveFile=/a b/c.jsa", cds.QUIET])
    assert shlex.split(joined) == ["-XX:TieredStopAtLevel=1", "-XX:SharedArchiveFile=/a b/c.jsa", cds.QUIET]
    assert cds.with_options(None, []) == ""


def test_xshare_on_refuses_an_archive_that_does_not_fit(tmp_path):
    """The instrument of the Spark tests: with -Xshare:on a JVM that cannot map its archive does
    not start. Shown on this checkout's archive (written for Spark's class path, so it does not
    fit a JVM without it) and on a damaged copy; the archive itself starts a JVM with the class
    path it was written for (test_spark_cli.py's clean-shell run)."""
    archive = _checkout_archive()
    damaged = tmp_path / "damaged.jsa"
    with open(archive, "rb") as src:
        damaged.write_bytes(src.read(1 << 20))
    for path in (archive, damaged):
        proc = subprocess.run(
            [str(cds.java()), "-Xshare:on", f"-XX:SharedArchiveFile={path}", cds.QUIET]
            + ["-XX:-CreateCoredumpOnCrash", "-XX:ErrorFile=/dev/null", "-version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, proc
        if path == archive:
            assert "Unable to use shared archive" in proc.stdout + proc.stderr, proc


def test_mqbatch_spark_needs_paths_unless_it_prepares(tmp_path):
    from mqbatch_testing import VENV_BIN

    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), "spark", "--out", "out"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "mqbatch spark: the following arguments are required: --landing (or --prepare)"
    )
    assert not pathlib.Path(tmp_path / "out").exists()
