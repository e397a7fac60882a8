"""`mqbatch ingest` as a child process, for tests and scenario tools that must SIGKILL it.

rec = RecorderProcess(log_path, host=..., port=..., cafile=..., landing=..., client_id="rec-1",
                      username="recorder", password_file=pw_path).start()   # returns once subscribed
rec.kill(); rec.start()        # a crash and a restart: the WAL is replayed, the session resumed
rec.stop()                     # SIGTERM: exit status
rec.output()                   # what it printed (all runs, appended to log_path)
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time


class RecorderProcess:
    def __init__(
        self,
        log: pathlib.Path,
        *,
        host: str,
        port: int,
        cafile,
        landing,
        client_id: str,
        username: str,
        password_file,
        extra: tuple[str, ...] = (),
    ):
        self.log = pathlib.Path(log)
        self.cmd = [
            str(pathlib.Path(sys.executable).parent / "mqbatch"),
            "ingest",
            "--host",
            host,
            "--port",
            str(port),
            "--cafile",
            str(cafile),
            "--username",
            username,
            "--password-file",
            str(password_file),
            "--landing",
            str(landing),
            "--client-id",
            client_id,
            "--progress-seconds",
            "1",
            *extra,
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "RecorderProcess":
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while "subscribed $share/" not in self.output(offset):
            if self.proc.poll() is not None:
                raise RuntimeError(f"recorder exited {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"recorder did not subscribe within {timeout} s:\n{self.output()}")
            time.sleep(0.05)
        return self

    def output(self, offset: int = 0) -> str:
        return self.log.read_bytes()[offset:].decode("utf-8", "replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (a crash)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.running:
            self.kill()
