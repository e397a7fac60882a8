"""A short version of the README's main command, end to end: broker with TLS/auth/ACL,
virtual devices running the firmware, a broker outage and a network cut, the recorder,
the Spark job, the summary and the HTML report. The demo exits non-zero if any
record a device stored on flash is missing from the curated table."""
import subprocess

from mqbatch_testing import VENV_BIN


def test_short_demo_end_to_end(tmp_path):
    run_dir = tmp_path / "demo"
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "demo", "--devices", "2", "--duration", "12",
                           "--outage-s", "3", "--cut-s", "2", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for step in range(1, 8):
        assert f"{step}/7 " in out
    assert "fault: broker outage" in out and "fault: network cut" in out
    assert "none lost" in out and "LOST" not in out
    html = (run_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 4
    assert "No record lost" in html
    assert (run_dir / "spark-out" / "report.json").exists()


def _processes_under(path) -> list[str]:
    """Processes whose command line or working directory mentions `path`."""
    import os
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue            # the process ended while we looked, or is not ours to read
        if str(path) in cmd or cwd.startswith(str(path)):
            found.append(f"{pid}: {cmd[:200]} (cwd {cwd})")
    return found


def test_ctrl_c_stops_everything_the_demo_started(tmp_path):
    import signal
    import time
    run_dir = tmp_path / "demo"
    proc = subprocess.Popen([str(VENV_BIN / "mqbatch"), "demo", "--devices", "2", "--duration", "60",
                             "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        seen.append(line)
        if "devices running" in line or time.monotonic() > deadline:
            break
    assert any("devices running" in x for x in seen), "".join(seen)
    assert _processes_under(run_dir), "the demo should have broker/devices/recorder running now"
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "interrupted" in rest
    time.sleep(1)
    assert _processes_under(run_dir) == []
