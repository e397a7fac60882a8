"""A virtual board: the MicroPython Unix port on a pseudo-terminal, with a board's
own flash.

The board's flash is a littlefs image, `<dir>/flash.img` (DEFAULT_FLASH, or
--flash-size), made on first start; boards/unix/vboot.py mounts it as the root
filesystem and unmounts the host's, so what the board sees, writes and imports
is inside the image (`/lib`, `/tmp`, `../x` included), and sys.path is a board's
('', .frozen, /lib). `<dir>/tty` is a pseudo-terminal that stays while the
interpreter behind it restarts, as a USB serial port does across resets:

- a hard reset (machine.reset(), mqb_board.reset(), `mqbatch vboard reset`, a
  crash that ends the interpreter) starts it again, which runs boot.py and
  main.py from the image;
- a soft reset (Ctrl-D at mpremote's raw REPL: `mpremote connect DIR/tty ls`
  and every command without `resume`) ends the Unix port, which cannot
  soft-reset: the supervisor prints "MPY: soft reboot", starts it again without
  main.py and puts it back into the raw REPL, as a board does.

Ctrl-C reaches main.py as SIGINT (the interpreter's own pty has ISIG). What the
host sends while the interpreter starts waits in the port until the board is up
(vboot.py says so before boot.py and main.py, or the REPL prompts), as a board's
UART buffer keeps it: a Ctrl-C that early would end the starting interpreter (a
restart that loses the bytes after it) or interrupt the mount. Everything
the device prints is appended to `<dir>/console.log`. Heap: DEFAULT_HEAP, what the
deployed firmware runs in with its .mpy files loaded into the heap
(docs/application.md has the figures).

    python -m mqbatch.lab.vboard DIR [--heapsize SIZE] [--flash-size SIZE]

runs one board until SIGINT, SIGTERM or SIGHUP (`mqbatch vboard start` starts it
in the background), SIGUSR1 resets it (`mqbatch vboard reset`); stopping ends the
interpreter: nothing is left behind.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
import tty

from mqbatch.util.paths import BOARDS, micropython_exe
from mqbatch.util.procs import SignalCalls, SignalStop, end_process, on_stop_signals

# measured: docs/application.md "Virtual board heap"
DEFAULT_HEAP = "256K"
DEFAULT_FLASH = "2M"  # an ESP32 4 MB module's filesystem partition is about this size
PID_FILE = "vboard.pid"
IMAGE = "flash.img"
BLOCK = 4096
RAW_PROMPT = b"raw REPL; CTRL-B to exit\r\n"


def parse_size(text: str) -> int:
    """'2M', '848K', '65536' -> bytes (a whole number of 4096-byte blocks, at least 16)."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024 * 1024}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise ValueError(f"flash size {text!r}: a number of bytes, or with K or M") from None
    if n % BLOCK or n < 16 * BLOCK:
        raise ValueError(f"flash size {text!r}: a multiple of {BLOCK} bytes, at least 64K")
    return n


SETSID = shutil.which("setsid")  # `setsid -c`: util-linux (essential in Debian) or BusyBox


def _take_terminal() -> None:
    """preexec_fn where there is no setsid: stdin (the pty) becomes the controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _set_raw(fd: int, isig: bool) -> None:
    tty.setraw(fd)
    attrs = termios.tcgetattr(fd)
    if isig:
        attrs[3] |= termios.ISIG
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


class VirtualBoard:
    def __init__(
        self, flash_dir: os.PathLike | str, heapsize: str | None = DEFAULT_HEAP, flash_size: str = DEFAULT_FLASH
    ):
        self.flash_dir = pathlib.Path(flash_dir).resolve()
        self.flash_dir.mkdir(parents=True, exist_ok=True)
        self.tty = self.flash_dir / "tty"
        self.console_log = self.flash_dir / "console.log"
        self.image = self.flash_dir / IMAGE
        self.heapsize = heapsize
        self.flash_bytes = parse_size(flash_size)
        self.boots = 0
        self.soft_resets = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._host: tuple[int, int] | None = None  # (master, slave) of DIR/tty
        self._raw = False  # the host side is in the raw REPL (the device printed its prompt)

    # -- the image -------------------------------------------------------------
    def _ensure_image(self) -> None:
        if self.image.exists():
            have = self.image.stat().st_size
            if have != self.flash_bytes:
                raise ValueError(
                    f"{self.image} holds {have} bytes, not the {self.flash_bytes} asked for: "
                    "keep its size or remove it (a new, empty flash)"
                )
            return
        with open(os.open(self.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(b"\xff" * self.flash_bytes)  # erased NOR flash; vboot.py formats it on first boot

    def _tool(self, spec: dict) -> None:
        if spec.get("put") and self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("the board is running: stop it first (its image is in use), or copy with mpremote")
        self._ensure_image()
        env = dict(self._env(False), MQB_VBOARD_TOOL=json.dumps(spec))
        cmd = [c for c in self._command() if c != "-i"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        if proc.returncode:
            raise RuntimeError(f"vboard image access failed: {proc.stdout[-500:]}{proc.stderr[-500:]}")

    def put(self, files: dict[str, os.PathLike | str]) -> None:
        """Write host files into the stopped board's image: {name on the board: host file}."""
        self._tool({"put": [[str(pathlib.Path(h).resolve()), n.lstrip("/")] for n, h in files.items()]})

    def listdir(self, path: str = "") -> list[str]:
        """Names in a folder of the board's image (read-only: the board may run)."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "ls"
            self._tool({"ls": [[path.lstrip("/"), str(out)]]})
            return json.loads(out.read_text())

    def get(self, name: str) -> bytes | None:
        """A file of the board's image, None if it has none (read-only: the board may run)."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "f"
            self._tool({"get": [[name.lstrip("/"), str(out)]]})
            return out.read_bytes() if out.exists() else None

    def _command(self) -> list[str]:
        mp = [str(micropython_exe())] + (["-X", f"heapsize={self.heapsize}"] if self.heapsize else [])
        return mp + ["-i", str(BOARDS / "unix" / "vboot.py")]

    def _env(self, soft: bool) -> dict:
        env = dict(os.environ, MQB_VBOARD="1", MQB_VBOARD_IMAGE=str(self.image))
        env["MQB_VBOARD_BLOCKS"] = str(self.flash_bytes // BLOCK)
        env.pop("MICROPYPATH", None)
        env.pop("MQB_VBOARD_SOFT", None)
        if soft:
            env["MQB_VBOARD_SOFT"] = "1"
        return env

    # -- the interpreter behind the port ----------------------------------------
    def _spawn(self, soft: bool) -> tuple[subprocess.Popen, int, int]:
        """The interpreter on a new pty, in a session of its own whose controlling terminal
        the pty is (Ctrl-C -> SIGINT): (process, the pty's master, the read end of the pipe
        on which vboot.py says the board is up). `setsid -c` (util-linux, BusyBox) makes the
        session and takes the terminal, then runs the interpreter in its own process (same
        pid); Python code between fork and exec (a preexec_fn) can deadlock a process with
        threads, as this one has, so it is the fallback only where there is no setsid."""
        master, slave = os.openpty()
        _set_raw(slave, isig=True)
        up_r, up_w = os.pipe()
        command, session = self._command(), {}
        if SETSID:  # not a group leader (start_new_session off): setsid(2) works, no fork
            command = [SETSID, "-c", *command]  # -c: util-linux and BusyBox alike
        else:
            session = {"start_new_session": True, "preexec_fn": _take_terminal}
        proc = subprocess.Popen(
            command,
            cwd=self.flash_dir,
            env=dict(self._env(soft), MQB_VBOARD_UP=str(up_w)),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            pass_fds=(up_w,),
            **session,  # type: ignore[call-overload]
        )
        os.close(slave)
        os.close(up_w)
        return proc, master, up_r

    def _to_host(self, data: bytes, log) -> None:
        log.write(data)
        log.flush()
        try:
            os.write(self._host[0], data)  # type: ignore[index]
        except BlockingIOError:
            pass  # nobody reads the port: dropped, as a board's USB serial does (console.log has it)

    def _run(self) -> None:
        log = open(self.console_log, "ab")
        host_master = self._host[0]  # type: ignore[index]
        soft = failing = False
        try:
            while not self._stop.is_set():
                with self._lock:
                    if self._stop.is_set():
                        break
                    self.boots += 1
                    self._proc, dev, up_r = self._spawn(soft)
                proc = self._proc
                up = False  # the board is up: the host's bytes go to it (until then they wait in the port)
                hold = soft  # after a soft reset: hide the banner until the raw REPL is back
                asked = False  # Ctrl-A sent (once: a second one would print a second prompt)
                seen = b""
                if soft:
                    self._to_host(b"MPY: soft reboot\r\n", log)
                last_host = b""
                while True:
                    watch = [dev, host_master] if up else [dev] + ([up_r] if up_r >= 0 else [])
                    ready, _, _ = select.select(watch, [], [], 0.2)
                    if up_r in ready:
                        up = os.read(up_r, 16) != b""  # b"": closed, no script ran: up at the REPL's prompt
                        os.close(up_r)
                        up_r = -1
                    if dev in ready:
                        try:
                            data = os.read(dev, 4096)
                        except OSError:
                            data = b""
                        if not data:
                            break
                        seen = (seen + data)[-64:]
                        if b">>> " in seen or RAW_PROMPT in seen:
                            up = True  # the REPL reads the port
                        if hold:
                            if not asked and b">>> " in seen:
                                os.write(dev, b"\x01")  # into the raw REPL, as before the reset
                                asked = True
                                seen = b""
                            if RAW_PROMPT in seen:
                                hold = False
                                self._to_host(seen[seen.index(RAW_PROMPT) :], log)
                            continue
                        if RAW_PROMPT in seen:
                            self._raw = True
                            seen = b""
                        self._to_host(data, log)
                    if host_master in ready:
                        try:
                            data = os.read(host_master, 4096)
                        except OSError:
                            data = b""
                        if data:
                            if b"\x02" in data:
                                self._raw = False
                            last_host = (last_host + data)[-8:]
                            try:
                                os.write(dev, data)
                            except OSError:
                                pass
                    if proc.poll() is not None and dev not in ready:
                        break
                proc.wait()
                os.close(dev)
                if up_r >= 0:
                    os.close(up_r)
                # it ended by itself before the board was up (not by a reset's signal), as when setsid
                # cannot take the terminal: said once a streak, on stderr and the port (console.log)
                if not up and proc.returncode > 0 and not self._stop.is_set():
                    if not failing:
                        line = f"vboard: the interpreter exited with {proc.returncode} before the board came up (restarting)"
                        self._to_host(f"{line}\r\n".encode(), log)
                        print(line, file=sys.stderr, flush=True)
                    failing = True
                elif up:
                    failing = False
                # the Unix port ends at Ctrl-D in the raw REPL (exit 0): a board soft-resets there
                soft = self._raw and proc.returncode == 0 and last_host.endswith(b"\x04")
                if soft:
                    self.soft_resets += 1
                else:
                    self._raw = False
                if not self._stop.is_set() and not soft:
                    time.sleep(0.2)
        finally:
            log.close()

    def start(self, timeout: float = 10) -> "VirtualBoard":
        self._command()  # configuration errors (no micropython) here, not in the thread
        self._ensure_image()
        master, slave = os.openpty()
        _set_raw(slave, isig=False)
        os.set_blocking(master, False)
        self._host = (master, slave)  # the slave stays open here: the port survives restarts
        self.tty.unlink(missing_ok=True)
        self.tty.symlink_to(os.ttyname(slave))
        self._thread = threading.Thread(target=self._run, name=f"vboard:{self.flash_dir.name}", daemon=True)
        self._thread.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.tty.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtual board {self.flash_dir} did not come up within {timeout} s")
            time.sleep(0.05)

    def wait_boot(self, boots: int, timeout: float = 20) -> None:
        """Wait until the board has booted `boots` times in all and its pty is up."""
        deadline = time.monotonic() + timeout
        while self.boots < boots or not self.tty.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtual board did not reach boot {boots} within {timeout} s (at {self.boots})")
            time.sleep(0.05)

    def reset(self) -> None:
        """A hard reset: end the interpreter; the supervisor boots it again (main.py runs)."""
        with self._lock:
            proc = self._proc
            self._raw = False
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc:
            end_process(proc, timeout=5)
        if self._thread:
            self._thread.join(10)
        if self._host:
            for fd in self._host:
                os.close(fd)
            self._host = None
        self.tty.unlink(missing_ok=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve(
    flash_dir: os.PathLike | str, heapsize: str | None = DEFAULT_HEAP, announce=print, flash_size: str = DEFAULT_FLASH
) -> int:
    """Run one virtual board in this process until SIGINT, SIGTERM or SIGHUP (SIGUSR1:
    a hard reset); write its pid file while it runs. Returns the exit status (0:
    stopped by a signal)."""
    stop = SignalStop()  # (Event.set() in a handler could deadlock: procs.SignalStop)
    on_stop_signals(stop.handler)  # SIGINT, SIGTERM, SIGHUP
    board = VirtualBoard(flash_dir, heapsize, flash_size)
    signal.signal(signal.SIGUSR1, SignalCalls(board.reset, "vboard-reset").handler)  # (reset takes a lock)
    pid_file = board.flash_dir / PID_FILE
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        board.start()
        announce(
            f"vboard: up, port {board.tty} (heap {heapsize or 'port default'}, flash {board.image} "
            f"{board.flash_bytes // 1024} KB, pid {os.getpid()}); device log: {board.console_log}"
        )
        sys.stdout.flush()
        while not stop.event.wait(0.5):
            pass
        announce(f"vboard: {stop.names[0]}: stopping the board")
        sys.stdout.flush()
        return 0
    finally:
        board.stop()
        pid_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mqbatch.lab.vboard", description=__doc__.split("\n\n")[0])
    p.add_argument("flash_dir")
    p.add_argument(
        "--heapsize", default=DEFAULT_HEAP, help=f"MicroPython heap (default {DEFAULT_HEAP}; 'none': the port's)"
    )
    p.add_argument("--flash-size", default=DEFAULT_FLASH, help=f"the flash image (default {DEFAULT_FLASH})")
    args = p.parse_args(argv)
    try:
        return serve(
            args.flash_dir, None if args.heapsize.lower() == "none" else args.heapsize, flash_size=args.flash_size
        )
    except (OSError, ValueError, TimeoutError) as e:
        print(f"vboard: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
