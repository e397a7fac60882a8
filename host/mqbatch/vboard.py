"""A virtual board: the MicroPython Unix port on a pseudo-terminal.

It behaves like a USB-attached board for mpremote: `micropython -i main.py`
runs in the board's flash directory (its working directory; only files
deployed there are importable), attached through socat to a pty linked at
`<flash_dir>/tty`. mpremote's Ctrl-C interrupts main.py (the pty delivers
SIGINT) and `-i` leaves the interpreter at the REPL, where the raw REPL works;
mpremote must be used with `resume` because the Unix port cannot soft-reset.
When the interpreter exits (the board's "reset"), the supervisor starts it
again, as a power cycle would. The device's stderr (its log) goes to
`<flash_dir>/console.log`.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import threading
import time

from mqbatch.paths import micropython_exe
from mqbatch.procs import end_process


class VirtualBoard:
    def __init__(self, flash_dir: os.PathLike | str, heapsize: str | None = "64K"):
        self.flash_dir = pathlib.Path(flash_dir).resolve()
        self.flash_dir.mkdir(parents=True, exist_ok=True)
        self.tty = self.flash_dir / "tty"
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
        for part in mp + [str(self.tty)]:
            if any(c in part for c in " ,:!\"'\\"):
                raise ValueError(f"socat cannot take {part!r} in an address: move the repo or board "
                                 "directory to a path without spaces, commas, colons, quotes or backslashes")
        inner = " ".join(mp + ["-i", "main.py"])
        return [socat, f"pty,raw,echo=0,link={self.tty}",
                f"exec:{inner},pty,raw,echo=0,isig=1,setsid,ctty"]

    def _run(self) -> None:
        log = open(self.flash_dir / "console.log", "ab")
        try:
            while not self._stop.is_set():
                env = dict(os.environ, MICROPYPATH=".frozen")
                with self._lock:
                    if self._stop.is_set():
                        break           # stop() came between the check above and here
                    self.boots += 1
                    self._proc = subprocess.Popen(self._command(), cwd=self.flash_dir, env=env,
                                                  stdout=log, stderr=log, stdin=subprocess.DEVNULL)
                self._proc.wait()
                if not self._stop.is_set():
                    time.sleep(0.2)
        finally:
            log.close()

    def start(self, timeout: float = 10) -> "VirtualBoard":
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
