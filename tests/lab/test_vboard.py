"""`mqbatch vboard` and the virtual board (mqbatch.lab.vboard): the device's output in
console.log, a default heap the deployed firmware runs in, main.py restarting the
board on an import error, and nothing left running after SIGINT, SIGTERM or SIGHUP."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest

from mqbatch.fleet.deploy import compile_firmware
from mqbatch.util.paths import BOARDS
from mqbatch.lab.vboard import PID_FILE, VirtualBoard
from mqbatch_testing import VENV_BIN


def flash_with_firmware(flash: pathlib.Path, build: pathlib.Path, **config) -> None:
    """What `mqbatch deploy` leaves on a board (.mpy files, main.py, config.json), copied directly."""
    flash.mkdir(parents=True, exist_ok=True)
    for name, path in compile_firmware("unix", build).items():
        shutil.copyfile(path, flash / name)
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(host="127.0.0.1", port=1, tls=False)      # nothing listens there: the app retries
    cfg.update(config)
    (flash / "config.json").write_text(json.dumps(cfg))


def wait_for_text(path: pathlib.Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got = path.read_text(errors="replace") if path.exists() else ""
        if text in got:
            return got
        assert time.monotonic() < deadline, f"{text!r} not in {path} within {timeout} s:\n{got[-3000:]}"
        time.sleep(0.1)


def processes_in(directory: pathlib.Path) -> list[str]:
    """Processes whose working directory or command line is `directory` (a board's leftovers)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue        # gone meanwhile, or not ours to read
        if cwd == str(directory) or str(directory / "tty") in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_import_memory_error_is_logged_to_console_log_and_the_board_restarts(tmp_path):
    """64K (the old default) cannot hold the deployed .mpy modules: main.py must log the
    MemoryError at `import mqb_app` and reset the board, and the log must be in console.log."""
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    with VirtualBoard(flash, heapsize="64K") as vb:
        vb.wait_boot(2, timeout=40)          # the supervisor restarted it after main.py's reset
    log = (flash / "console.log").read_text(errors="replace")
    assert "MemoryError" in log and "mqb: fatal error, restarting the board in 5 s" in log, log[-3000:]


def test_default_heap_runs_the_deployed_firmware(tmp_path):
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build", device_id="dev-heap", health_every_s=1)
    with VirtualBoard(flash) as vb:          # the default heap
        log = wait_for_text(flash / "console.log", "connect", timeout=30)
        time.sleep(2)
        assert vb.boots == 1
    log = (flash / "console.log").read_text(errors="replace")
    assert "MemoryError" not in log and "fatal error" not in log, log[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_vboard_foreground_stops_everything_on_a_signal(tmp_path, sig):
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    proc = subprocess.Popen([str(VENV_BIN / "mqbatch"), "vboard", "start", "--foreground", "--dir", str(flash)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (flash / "tty").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "no tty"
            time.sleep(0.05)
        wait_for_text(flash / "console.log", "mqb:", timeout=30)
        assert processes_in(flash), "the board's interpreter should be running"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"{signal.Signals(sig).name}: stopping the board" in out
    time.sleep(0.5)
    assert processes_in(flash) == [], "left running after the board stopped"
    assert not (flash / PID_FILE).exists()


def test_vboard_start_console_stop_in_the_background(tmp_path):
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    mq = str(VENV_BIN / "mqbatch")
    start = subprocess.run([mq, "vboard", "start", "--dir", str(flash)], capture_output=True, text=True, timeout=60)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert f"port {flash / 'tty'}" in start.stdout
        again = subprocess.run([mq, "vboard", "start", "--dir", str(flash)], capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "already runs" in again.stderr
        wait_for_text(flash / "console.log", "mqb:", timeout=30)
        con = subprocess.run([mq, "vboard", "console", "--dir", str(flash)], capture_output=True, text=True, timeout=30)
        assert con.returncode == 0 and "mqb:" in con.stdout
    finally:
        stop = subprocess.run([mq, "vboard", "stop", "--dir", str(flash)], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    time.sleep(0.5)
    assert processes_in(flash) == []
    gone = subprocess.run([mq, "vboard", "stop", "--dir", str(flash)], capture_output=True, text=True, timeout=30)
    assert gone.returncode == 1 and "no board runs" in gone.stderr
