"""Ending child processes: one way for every part of mqbatch that starts them."""
from __future__ import annotations

import os
import signal
import subprocess


def end_process(p: subprocess.Popen, timeout: float = 10.0, group: bool = False) -> int | None:
    """SIGTERM p (its whole process group if `group`, for children started with
    start_new_session=True), SIGKILL after `timeout` s. Returns p's exit code."""
    def send(sig):
        try:
            if group:
                os.killpg(p.pid, sig)
            elif p.poll() is None:
                p.send_signal(sig)
        except ProcessLookupError:
            return False        # already gone
        return True

    if p.poll() is not None and not group:
        return p.returncode
    send(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        p.wait(5)
    if group:
        send(signal.SIGKILL)    # the leader is gone; anything it left in its group goes too
    return p.returncode
