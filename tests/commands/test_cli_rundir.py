"""mqbatch.util.rundir.fresh_dir: the one helper every command that wipes a folder uses.
It wipes only what mqbatch made (marker file) or an empty folder."""

import os

import pytest

from mqbatch.util.rundir import MARKER, DirNotOurs, fresh_dir


def test_new_then_rerun_wipes_its_own_directory(tmp_path):
    d = fresh_dir(tmp_path / "a" / "run", "mqbatch test")
    assert (d / MARKER).read_text().startswith("made by mqbatch test")
    (d / "old-output.parquet").write_bytes(b"x")
    fresh_dir(d, "mqbatch test")
    assert sorted(p.name for p in d.iterdir()) == [MARKER]


def test_empty_directory_is_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    assert (fresh_dir(tmp_path / "empty", "mqbatch test") / MARKER).exists()


def test_a_users_folder_is_refused_untouched(tmp_path):
    d = tmp_path / "photos"
    (d / "2019").mkdir(parents=True)
    (d / "2019" / "a.jpg").write_bytes(b"jpeg")
    with pytest.raises(DirNotOurs, match=r"photos is not empty and was not made by mqbatch.*--build-dir"):
        fresh_dir(d, "mqbatch test", flag="--build-dir")
    assert (d / "2019" / "a.jpg").read_bytes() == b"jpeg" and not (d / MARKER).exists()


def test_a_symlink_to_a_folder_is_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / MARKER).write_text("")
    os.symlink(target, tmp_path / "link")
    with pytest.raises(DirNotOurs, match="not a plain directory"):
        fresh_dir(tmp_path / "link", "mqbatch test")
    assert (target / MARKER).exists()


def test_deploys_old_build_directories_count_as_ours(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    (d / ".mqbatch-build").write_text("made by mqbatch deploy")
    (d / "main.mpy").write_bytes(b"M")
    fresh_dir(d, "mqbatch deploy", flag="--build-dir")
    assert not (d / "main.mpy").exists()


def test_a_run_of_a_version_before_the_marker_is_recognised_by_its_entries(tmp_path):
    old = tmp_path / "demo"
    (old / "landing").mkdir(parents=True)
    (old / "report.html").write_text("old report")
    known = frozenset({"landing", "report.html", "spark-out"})
    fresh_dir(old, "mqbatch demo", known=known)
    assert sorted(p.name for p in old.iterdir()) == [MARKER]
    (old / MARKER).unlink()
    (old / "notes.txt").write_text("mine")  # one foreign entry: not ours
    with pytest.raises(DirNotOurs):
        fresh_dir(old, "mqbatch demo", known=known)
    assert (old / "notes.txt").exists()
