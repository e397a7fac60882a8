"""run_child (mqbatch.spark.submit) must end spark-submit's process group within its grace
period after a stop signal, even when the group ignores SIGTERM. (Seen in CI: a JVM slow to
shut down kept `mqbatch spark` waiting past the test's 120 s; the grace period only began
when the child exited by itself, so it never began.) No JVM here: the child is a shell that
ignores SIGTERM, as a JVM stuck in its shutdown hooks does."""

import os
import signal
import subprocess
import sys
import time

from test_spark_cli import _group  # live members of a process group, read from /proc

from mqbatch.util.paths import ROOT

RUNNER = """
import sys
from mqbatch.spark import submit
submit.STOP_GRACE_S = {grace}
child = ["sh", "-c", "trap '' TERM; echo up; sleep 600 & wait; sleep 600"]
sys.exit(submit.run_child(child, {{"PATH": "/usr/bin:/bin"}}))
"""


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    grace = 2
    env = dict(os.environ, PYTHONPATH=str(ROOT / "host"))
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER.format(grace=grace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    child_pgid = None
    try:
        assert runner.stdout.readline().strip() == "up"
        child_pgid = int(subprocess.check_output(["pgrep", "-P", str(runner.pid)], text=True).split()[0])
        t0 = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        code = runner.wait(timeout=grace + 30)
        took = time.monotonic() - t0
    finally:
        if runner.poll() is None:
            runner.kill()
        if child_pgid is not None and _group(child_pgid):  # a failed run leaves no `sleep 600` (it ignores SIGTERM)
            os.killpg(child_pgid, signal.SIGKILL)
    assert code == 128 + signal.SIGTERM, runner.stderr.read()[-2000:]
    assert took < grace + 15, f"stopped after {took:.1f} s with a grace period of {grace} s"
    assert "stopped by SIGTERM" in runner.stderr.read()
    deadline = time.monotonic() + 10
    while _group(child_pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(child_pgid) == [], "the child's process group outlived the stop"
