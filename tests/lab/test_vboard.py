"""`mqbatch vboard` and the virtual board (mqbatch.lab.vboard): the device's output in
console.log, a default heap the deployed firmware runs in, main.py restarting the
board on an import error, and nothing left running after SIGINT, SIGTERM or SIGHUP."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time

import pytest

from mqbatch.fleet.deploy import compile_firmware
from mqbatch.lab import vboard
from mqbatch.lab.vboard import PID_FILE, VirtualBoard
from mqbatch.util.paths import BOARDS
from mqbatch_testing import VENV_BIN


def flash_with_firmware(flash: pathlib.Path, build: pathlib.Path, **config) -> VirtualBoard:
    """What `mqbatch deploy` leaves on a board (.mpy files, main.py, config.json), written
    straight into the board's flash image (the board is not started)."""
    files = compile_firmware("unix", build)
    cfg = json.loads((BOARDS / "unix" / "config.template.json").read_text())
    cfg["broker"].update(host="127.0.0.1", port=1, tls=False)  # nothing listens there: the app retries
    cfg.update(config)
    (build / "config.json").write_text(json.dumps(cfg))
    vb = VirtualBoard(flash)
    vb.put({**{n: str(p) for n, p in files.items()}, "config.json": str(build / "config.json")})
    return vb


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
            continue  # gone meanwhile, or not ours to read
        if cwd == str(directory) or str(directory / "tty") in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_import_memory_error_is_logged_to_console_log_and_the_board_restarts(tmp_path):
    """64K (the old default) cannot hold the deployed .mpy modules: main.py must log the
    MemoryError at `import mqb_app` and reset the board, and the log must be in console.log."""
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    with VirtualBoard(flash, heapsize="64K") as vb:
        vb.wait_boot(2, timeout=40)  # the supervisor restarted it after main.py's reset
    log = (flash / "console.log").read_text(errors="replace")
    assert "MemoryError" in log and "mqb: fatal error, restarting the board in 5 s" in log, log[-3000:]


def test_default_heap_runs_the_deployed_firmware(tmp_path):
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build", device_id="dev-heap", health_every_s=1)
    with VirtualBoard(flash) as vb:  # the default heap
        log = wait_for_text(flash / "console.log", "connect", timeout=30)
        time.sleep(2)
        assert vb.boots == 1
    log = (flash / "console.log").read_text(errors="replace")
    assert "MemoryError" not in log and "fatal error" not in log, log[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_vboard_foreground_stops_everything_on_a_signal(tmp_path, sig):
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    proc = subprocess.Popen(
        [str(VENV_BIN / "mqbatch"), "vboard", "start", "--foreground", "--dir", str(flash)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


def start_in_background(tmp_path) -> tuple[pathlib.Path, str, subprocess.CompletedProcess]:
    """A board with the firmware, started by `mqbatch vboard start` (the caller stops it)."""
    flash = tmp_path / "board"
    flash_with_firmware(flash, tmp_path / "build")
    mq = str(VENV_BIN / "mqbatch")
    start = subprocess.run([mq, "vboard", "start", "--dir", str(flash)], capture_output=True, text=True, timeout=60)
    return flash, mq, start


def test_vboard_start_console_stop_in_the_background(tmp_path):
    flash, mq, start = start_in_background(tmp_path)
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


def mpremote(tty, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    """mpremote as against a board: no `resume` (it soft-resets the board at connect)."""
    return subprocess.run(
        [str(VENV_BIN / "mpremote"), "connect", str(tty), *args], capture_output=True, text=True, timeout=timeout
    )


def test_mpremote_works_against_it_as_against_a_board(tmp_path):
    """ls, cp, exec, soft-reset and reset without `resume`: the pty stays while the
    interpreter behind it restarts; a soft reset comes back to the raw REPL without
    main.py, a hard reset (mpremote reset, `mqbatch vboard reset`) runs main.py again."""
    flash = tmp_path / "board"
    vb = flash_with_firmware(flash, tmp_path / "build")
    (tmp_path / "note.txt").write_text("hello")
    with vb:
        wait_for_text(flash / "console.log", "mqb:", timeout=30)
        ls = mpremote(vb.tty, "ls")
        assert ls.returncode == 0 and "main.py" in ls.stdout and "mqb_app.mpy" in ls.stdout, ls.stdout + ls.stderr
        assert "Traceback" not in ls.stdout + ls.stderr and "rror" not in ls.stderr, ls.stdout + ls.stderr
        assert vb.soft_resets == 1 and vb.boots == 2, (vb.soft_resets, vb.boots)
        cp = mpremote(vb.tty, "cp", str(tmp_path / "note.txt"), ":note.txt")
        assert cp.returncode == 0, cp.stderr
        ex = mpremote(vb.tty, "exec", "print(open('note.txt').read(), len(__import__('os').listdir('/')))")
        assert ex.returncode == 0 and ex.stdout.startswith("hello "), ex.stdout + ex.stderr
        assert mpremote(vb.tty, "soft-reset").returncode == 0
        booted = (flash / "console.log").read_text(errors="replace").count("mqb: boot")
        reset = mpremote(vb.tty, "reset")
        assert reset.returncode == 0, reset.stdout + reset.stderr
        deadline = time.monotonic() + 30
        while (flash / "console.log").read_text(errors="replace").count("mqb: boot") <= booted:
            assert time.monotonic() < deadline, "main.py did not run after `mpremote reset`"
            time.sleep(0.2)
    assert vb.get("note.txt") == b"hello"


@pytest.mark.parametrize("setsid", ["setsid -c", "no setsid: preexec_fn"])
def test_the_interpreter_leads_a_session_whose_terminal_is_its_pty(tmp_path, monkeypatch, setsid):
    """Ctrl-C on the port is SIGINT to main.py only if the interpreter's pty is its
    controlling terminal: the interpreter itself (not a wrapper) leads a session of its
    own, and its tty is the one on its stdin. Set up without Python code between fork and
    exec (`setsid -c`) where there is a setsid, else by a preexec_fn."""
    if setsid.startswith("no"):
        monkeypatch.setattr(vboard, "SETSID", None)
    else:
        assert vboard.SETSID, "util-linux's setsid is not on PATH"
    flash = tmp_path / "board"
    vb = flash_with_firmware(flash, tmp_path / "build")
    with vb:
        wait_for_text(flash / "console.log", "mqb:", timeout=30)
        pid = vb._proc.pid
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session tty_nr
        session, tty_nr = int(fields[3]), int(fields[4])
        stdin = os.stat(f"/proc/{pid}/fd/0")
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"vboot.py" in cmdline[-2] and b"setsid" not in cmdline[0], cmdline  # the interpreter itself
        assert session == pid, f"the interpreter ({pid}) is in session {session}, not one of its own"
        assert tty_nr != 0 and tty_nr == stdin.st_rdev, f"controlling tty {tty_nr}, its pty {stdin.st_rdev}"


class NeverUpBoard(VirtualBoard):
    """A board whose interpreter cannot start (as `setsid -c` failing would leave it)."""

    def _command(self) -> list[str]:
        return ["sh", "-c", "exit 3"]


def test_an_interpreter_that_never_comes_up_is_said_once_not_restarted_silently(tmp_path, capfd):
    """The supervisor restarts an interpreter that ended; one that ends before the board is
    up, again and again, is said once (stderr and the port, so console.log), not hidden."""
    vb = NeverUpBoard(tmp_path / "board")
    with vb:
        deadline = time.monotonic() + 20
        while vb.boots < 4:
            assert time.monotonic() < deadline, f"only {vb.boots} starts"
            time.sleep(0.05)
    line = "vboard: the interpreter exited with 3 before the board came up (restarting)"
    assert capfd.readouterr().err.count(line) == 1
    assert (tmp_path / "board" / "console.log").read_text().count(line) == 1


class SlowBootBoard(VirtualBoard):
    """A virtual board whose interpreter takes `delay` s to start, as on a loaded machine."""

    delay = 1.0

    def _command(self) -> list[str]:
        return ["sh", "-c", f'sleep {self.delay}; exec "$@"', "sh", *super()._command()]


def test_bytes_sent_while_the_board_boots_wait_for_it(tmp_path):
    """mpremote may connect before the interpreter behind the port is up (the port exists
    from start(); on a loaded machine the boot takes seconds): its Ctrl-C and Ctrl-A must
    reach the board once it runs, as a board's UART buffer keeps them, not kill the
    starting interpreter (a restart that loses the Ctrl-A: 'could not enter raw repl')
    nor interrupt the mount of its flash."""
    flash = tmp_path / "board"
    with SlowBootBoard(flash) as vb:
        ex = mpremote(vb.tty, "resume", "exec", "import os; print(6 * 7, os.listdir('/'))", timeout=60)
        assert ex.returncode == 0 and ex.stdout.startswith("42 []"), ex.stdout + ex.stderr
        assert vb.boots == 1, vb.boots
    log = (flash / "console.log").read_text(errors="replace")
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def host_paths_written(names: list[str]) -> list[str]:
    """Which of these host paths exist (what a board's writes must never create)."""
    return [n for n in names if os.path.lexists(n)]


def test_a_vboard_cannot_write_outside_its_image(tmp_path):
    """/lib, /tmp and ../ paths, and `mpremote mip install --target /lib`, land in the
    board's littlefs image; nothing appears on the host, and host files cannot be read."""
    flash = tmp_path / "board"
    tag = f"mqbvb{os.getpid()}{time.monotonic_ns() % 100000}"
    host = [
        f"/lib/{tag}",
        f"/tmp/{tag}",
        str(flash.parent / tag),
        str(flash / tag),
        f"/lib/{tag}.py",
        "/lib/mqb_board.py",
    ]
    assert host_paths_written(host) == []
    script = f"""
import os
res = []
for d in ("/lib", "/tmp"):
    try:
        os.mkdir(d)
    except OSError:
        pass
for p in ("/lib/{tag}", "/tmp/{tag}", "../{tag}", "../../{tag}", "{tag}"):
    try:
        with open(p, "w") as f:
            f.write("x")
        res.append(p)
    except OSError as e:
        res.append("refused " + p)
try:
    open("/etc/hostname").read()
    res.append("READ HOST FILE")
except OSError:
    pass
print("RES", res, os.getcwd(), sorted(os.listdir("/")))
"""
    with VirtualBoard(flash) as vb:
        ex = mpremote(vb.tty, "exec", script)
        assert ex.returncode == 0 and "RES" in ex.stdout, ex.stdout + ex.stderr
        assert "READ HOST FILE" not in ex.stdout and "'/lib/" in ex.stdout and "'/tmp/" in ex.stdout, ex.stdout
        mip = mpremote(vb.tty, "mip", "install", "--target", "/lib", str(BOARDS / "unix" / "package.json"))
        assert mip.returncode == 0 and "Installing: /lib/mqb_board.py" in mip.stdout, mip.stdout + mip.stderr
    print(ex.stdout)
    assert host_paths_written(host) == [], "a board wrote to the host"
    assert vb.get(f"lib/{tag}") == b"x" and vb.get(f"tmp/{tag}") == b"x" and vb.get(tag) == b"x"
    assert vb.get("lib/mqb_board.py") == (BOARDS / "unix" / "mqb_board.py").read_bytes()
    assert vb.listdir("") == sorted(["lib", "tmp", tag])


def test_host_paths_written_sees_a_write_made_without_the_image(tmp_path):
    """The check above can fail: the plain Unix port (no vboard) writes to the host."""
    target = tmp_path / "escaped"
    subprocess.run(
        [str(VENV_BIN / "micropython"), "-c", f"open({str(target)!r}, 'w').write('x')"], check=True, timeout=30
    )
    assert host_paths_written([str(target)]) == [str(target)]


def test_vboard_reset_command_runs_main_again(tmp_path):
    flash, mq, start = start_in_background(tmp_path)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert (flash / "flash.img").stat().st_size == 2 * 1024 * 1024  # DEFAULT_FLASH
        wait_for_text(flash / "console.log", "mqb: boot", timeout=30)
        before = (flash / "console.log").read_text(errors="replace").count("mqb: boot")
        r = subprocess.run([mq, "vboard", "reset", "--dir", str(flash)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "reset the board" in r.stdout, r.stdout + r.stderr
        deadline = time.monotonic() + 30
        while (flash / "console.log").read_text(errors="replace").count("mqb: boot") <= before:
            assert time.monotonic() < deadline, "no new boot after `mqbatch vboard reset`"
            time.sleep(0.2)
    finally:
        subprocess.run([mq, "vboard", "stop", "--dir", str(flash)], capture_output=True, text=True, timeout=60)
    gone = subprocess.run([mq, "vboard", "reset", "--dir", str(flash)], capture_output=True, text=True, timeout=30)
    assert gone.returncode == 1 and "no board runs" in gone.stderr
    other = subprocess.run(
        [mq, "vboard", "start", "--dir", str(flash), "--flash-size", "1M"], capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 1 and "holds 2097152 bytes, not the 1048576 asked for" in other.stderr, other.stderr
