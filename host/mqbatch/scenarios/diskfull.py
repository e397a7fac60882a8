"""Issue 22's "disk full for 60 s then freed": the recorder's landing zone on a small tmpfs
of the run's own, filled to the last byte (the recorder's next write or fsync fails with
ENOSPC) for a while, then freed; the recorder must stop acknowledging, wait, and resume by
itself (docs/reliability.md). Needs root (mount).

    disk = Tmpfs(run_dir / "disk", size_mb=32).mount()
    filler = disk.fill()          # every free byte taken
    disk.free()                   # the filler removed
    disk.unmount()
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

BLOCKED = "landing blocked: ENOSPC"  # the recorder's lines on its state changes (mqbatch.ingest.recorder)
RESUMED = "landing resumed"


class ScenarioUnavailable(RuntimeError):
    """This machine cannot run the scenario (the message says why)."""


class Tmpfs:
    def __init__(self, path, size_mb: int = 32):
        self.path, self.size_mb = pathlib.Path(path), size_mb
        self.filler = self.path / "filler"
        self.mounted = False

    def mount(self) -> "Tmpfs":
        if os.geteuid() != 0:
            raise ScenarioUnavailable("disk-full needs root to mount a small tmpfs (a landing disk that fills up)")
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0700", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ScenarioUnavailable(f"cannot mount a tmpfs at {self.path}: {done.stderr.strip()}")
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Take every free byte: one fallocate of what statvfs says is free, then small writes
        until ENOSPC (the recorder may have taken some meanwhile). Returns the filler's size."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, max(1, self.free_bytes() - 4096))
            except OSError:
                pass  # less free than statvfs said: the writes below take the rest
            os.lseek(fd, 0, os.SEEK_END)
            chunk = 4096
            while chunk >= 64:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError:
                    chunk //= 4
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
            self.mounted = False


def disk_full(h, run_for_s: float, rng) -> None:
    """From 20 % of the run the landing disk is full for h.disk_full_s (60 s in issue 22), then
    freed; the run goes on to run_for_s. h.checks["disk_full"] says whether the recorder
    really was blocked (else the fault did not bite and the run proves nothing), whether it
    resumed by itself, and whether it was still running (never restarted by the harness)."""
    time.sleep(run_for_s * 0.2)
    log_from = h.recorder.log.stat().st_size
    size = h.tmpfs.fill()
    h.fault(f"landing disk full ({size >> 20} MiB filler) for {h.disk_full_s:g} s")
    time.sleep(h.disk_full_s)
    blocked = BLOCKED in h.recorder.output(log_from)
    running_when_freed = h.recorder.running
    h.tmpfs.free()
    h.fault("landing disk freed")
    freed = time.monotonic()
    resumed_after = None
    while time.monotonic() - freed < 60:
        if RESUMED in h.recorder.output(log_from):
            resumed_after = round(time.monotonic() - freed, 1)
            break
        time.sleep(0.2)
    check = {
        "blocked": blocked,
        "recorder_running_when_freed": running_when_freed,
        "resumed_s_after_free": resumed_after,
    }
    h.checks["disk_full"] = check
    if not blocked:
        h.problems.append("disk-full: the recorder never said it was blocked (the fault did not bite)")
    if not running_when_freed:
        h.problems.append("disk-full: the recorder exited while the disk was full")
    if resumed_after is None:
        h.problems.append("disk-full: the recorder did not say it resumed within 60 s of the free")
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))
