"""A virtual board: the MicroPython Unix port on a pseudo-terminal.

It behaves like a USB-attached board for mpremote: `micropython -i main.py`
runs in the board's flash directory (its working directory; only files
deployed there are importable), attached through socat to a pty linked at
`<flash_dir>/tty`. mpremote's Ctrl-C interrupts main.py (the pty delivers
SIGINT) and `-i` leaves the interpreter at the REPL, where the raw REPL works;
mpremote must be used with `resume` because the Unix port cannot soft-reset.
When the interpreter exits (the board's "reset"), the supervisor starts it
again, as a power cycle would. Everything the device prints (its log, also
what mpremote sees) is appended to `<flash_dir>/console.log`, with socat's own
messages.

Heap: DEFAULT_HEAP, a heap the deployed firmware runs in: as .mpy files (what
`mqbatch deploy` copies; loaded into the heap, bytecode included, unlike the
ROMFS image of `mqbatch devices`) and as sources installed with `mpremote mip`
(compiled on the device, which needs more); docs/application.md has the figures.
sys.path is a board's: the flash root, `.frozen`, then `<flash_dir>/lib` (where
`mpremote mip install` puts packages).

    python -m mqbatch.lab.vboard FLASH_DIR [--heapsize SIZE]

runs one board until SIGINT, SIGTERM or SIGHUP (`mqbatch vboard start` starts it
in the background), then stops the interpreter and socat: nothing is left behind.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

from mqbatch.util.paths import micropython_exe
from mqbatch.util.procs import end_process

# measured: docs/application.md "Virtual board heap"
DEFAULT_HEAP = "256K"
PID_FILE = "vboard.pid"


class VirtualBoard:
    def __init__(self, flash_dir: os.PathLike | str, heapsize: str | None = DEFAULT_HEAP):
        self.flash_dir = pathlib.Path(flash_dir).resolve()
        self.flash_dir.mkdir(parents=True, exist_ok=True)
        self.tty = self.flash_dir / "tty"
        self.console_log = self.flash_dir / "console.log"
        self.heapsize = heapsize
        self.boots = 0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _command(self) -> list[str]:
        socat = shutil.which("socat")
        if not socat:
            raise FileNotFoundError("socat not found (make setup installs it)")
        mp = [str(micropython_exe())] + (["-X", f"heapsize={self.heapsize}"] if self.heapsize else [])
        for part in mp + [str(self.tty), str(self.console_log)]:
            if any(c in part for c in " ,:!\"'\\"):
                raise ValueError(
                    f"socat cannot take {part!r} in an address: move the repo or board "
                    "directory to a path without spaces, commas, colons, quotes or backslashes"
                )
        inner = " ".join(mp + ["-i", "main.py"])
        # -R: socat appends what flows right to left (the device's output) to console.log
        return [
            socat,
            "-R",
            str(self.console_log),
            f"pty,raw,echo=0,link={self.tty}",
            f"exec:{inner},pty,raw,echo=0,isig=1,setsid,ctty",
        ]

    def _run(self) -> None:
        log = open(self.console_log, "ab")
        try:
            while not self._stop.is_set():
                # sys.path as on a board: '' (the flash root, here the script's directory), .frozen, /lib
                # MQB_VBOARD: boards/unix/mqb_board.reset() ends the process (see there)
                env = dict(os.environ, MICROPYPATH=f".frozen:{self.flash_dir}/lib", MQB_VBOARD="1")
                with self._lock:
                    if self._stop.is_set():
                        break  # stop() came between the check above and here
                    self.boots += 1
                    self._proc = subprocess.Popen(
                        self._command(), cwd=self.flash_dir, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
                    )
                self._proc.wait()
                if not self._stop.is_set():
                    time.sleep(0.2)
        finally:
            log.close()

    def start(self, timeout: float = 10) -> "VirtualBoard":
        self._command()  # configuration errors (no socat, bad path) here, not in the thread
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

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc:
            end_process(proc, timeout=5)
        if self._thread:
            self._thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve(flash_dir: os.PathLike | str, heapsize: str | None = DEFAULT_HEAP, announce=print) -> int:
    """Run one virtual board in this process until SIGINT, SIGTERM or SIGHUP; write
    its pid file while it runs. Returns the exit status (0: stopped by a signal)."""
    stop = threading.Event()
    caught: list[str] = []

    def on_signal(signum, frame):
        caught.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    board = VirtualBoard(flash_dir, heapsize)
    pid_file = board.flash_dir / PID_FILE
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        board.start()
        announce(
            f"vboard: up, port {board.tty} (heap {heapsize or 'port default'}, pid {os.getpid()}); "
            f"device log: {board.console_log}"
        )
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
        announce(f"vboard: {caught[0]}: stopping the board")
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
    args = p.parse_args(argv)
    try:
        return serve(args.flash_dir, None if args.heapsize.lower() == "none" else args.heapsize)
    except (OSError, ValueError, TimeoutError) as e:
        print(f"vboard: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
