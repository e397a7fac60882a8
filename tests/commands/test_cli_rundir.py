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


# -- the lock: one run per directory (claim_dir) -----------------------------------------

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from mqbatch.util.rundir import LOCK_FILE, DirInUse, claim_dir  # noqa: E402

HOLD = (
    "import sys, time, pathlib\n"
    "from mqbatch.util.rundir import claim_dir, lock_dir\n"
    "d, owner = pathlib.Path(sys.argv[1]), sys.argv[2]\n"
    "held = lock_dir(d, owner) if owner.endswith('fleet run') else "
    "claim_dir(d, owner, known=frozenset({'stack', 'devices', 'landing'}))\n"
    "with held:\n"
    "    print('held', flush=True)\n"
    "    time.sleep(300)\n"
)


def hold(path, owner="mqbatch demo") -> subprocess.Popen:
    """Another process (a real one: flock is per open file) holding `path` until killed
    (lock_dir for `fleet run`, claim_dir otherwise)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), owner], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_claim_is_refused_naming_the_holder_and_touches_nothing(tmp_path):
    d = tmp_path / "run"
    holder = hold(d)
    try:
        (d / "landing").mkdir()
        (d / "landing" / "part-1.parquet").write_bytes(b"the first run's data")
        with pytest.raises(DirInUse, match=rf"{d} is in use by pid {holder.pid} \(mqbatch demo\).*--run-dir"):
            with claim_dir(d, "mqbatch demo"):
                pytest.fail("entered a directory another process holds")
        assert (d / "landing" / "part-1.parquet").read_bytes() == b"the first run's data"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    d = tmp_path / "run"
    holder = hold(d)
    holder.send_signal(signal.SIGKILL)  # a crash: no clean-up ran
    holder.wait()
    assert (d / LOCK_FILE).exists()
    with claim_dir(d, "mqbatch demo") as got:
        assert sorted(p.name for p in got.iterdir()) == sorted([LOCK_FILE, MARKER])
        assert (d / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")


def test_claim_refuses_a_users_folder_without_writing_a_lock_into_it(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    with pytest.raises(DirNotOurs):
        with claim_dir(d, "mqbatch devices", flag="--dir"):
            pytest.fail("claimed a folder of the user's")
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


def run_one_device(command: str, flag: str, run_dir) -> subprocess.CompletedProcess:
    """`mqbatch demo|devices` with one device for 5 s in `run_dir`."""
    from mqbatch_testing import VENV_BIN

    extra = ["--devices", "1"] if command == "demo" else ["--count", "1"]
    return subprocess.run(
        [str(VENV_BIN / "mqbatch"), command, *extra, "--duration", "5", flag, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command, flag", [("demo", "--run-dir"), ("devices", "--dir")])
def test_a_second_run_in_the_same_directory_says_so_in_one_line(tmp_path, command, flag):
    """Two demos at once in one run directory broke each other (one after 18 s, the other
    after 3 min, each printing ~400 lines of Mosquitto log): now the second stops at once."""
    d = tmp_path / "run"
    holder = hold(d, f"mqbatch {command}")
    try:
        t0 = time.monotonic()
        proc = run_one_device(command, flag, d)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and flag in lines[0], proc.stderr
    assert lines[0].startswith(f"{command}: {d} is in use by pid {holder.pid} (mqbatch {command})")
    assert took < 15, f"refused only after {took:.1f} s"
    assert sorted(p.name for p in d.iterdir()) == sorted([LOCK_FILE, MARKER])  # nothing of ours written


@pytest.mark.parametrize("command, flag", [("demo", "--run-dir"), ("devices", "--dir")])
def test_devices_dir_refuses_a_users_folder_like_demo_run_dir(tmp_path, command, flag):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    proc = run_one_device(command, flag, mine)
    assert proc.returncode == 2, proc.stderr
    assert f"{mine} is not empty and was not made by mqbatch" in proc.stderr and flag in proc.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]


def test_fleet_run_locks_its_flash_directory_without_wiping_it(tmp_path):
    """`fleet run` keeps each device's flash (boot counter, outbox) across runs: lock_dir
    locks it like claim_dir, and wipes nothing."""
    from mqbatch.lab.broker import free_port
    from mqbatch_testing import VENV_BIN

    mq = str(VENV_BIN / "mqbatch")
    fleet, run_dir = tmp_path / "fleet", tmp_path / "flash"
    init = [mq, "fleet", "init", str(fleet), "--broker-host", "127.0.0.1", "--port", str(free_port())]
    assert subprocess.run(init, capture_output=True).returncode == 0
    assert subprocess.run([mq, "fleet", "add", str(fleet), "porch-1"], capture_output=True).returncode == 0
    (run_dir / "porch-1").mkdir(parents=True)
    (run_dir / "porch-1" / "boot_count").write_text("7")  # an earlier run's flash
    holder = hold(run_dir, "mqbatch fleet run")
    try:
        cmd = [mq, "fleet", "run", str(fleet), "porch-1", "--duration", "5", "--run-dir", str(run_dir)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"mqbatch fleet: {run_dir} is in use by pid {holder.pid} (mqbatch fleet run): "
        "wait for it to end, or choose another --run-dir"
    )
    assert (run_dir / "porch-1" / "boot_count").read_text() == "7"  # neither run wiped the flash
