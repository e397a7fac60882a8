"""Ctrl-C (SIGINT), `kill` (SIGTERM) and a closed terminal (SIGHUP) stop `mqbatch demo`
and `mqbatch devices` the same way: every process they started (Mosquitto, the
relay, devices, the recorder, the Spark job and its JVM) is stopped, nothing is
left behind, and the exit status is 128 + the signal number."""

import os
import signal
import subprocess
import time

import pytest

from mqbatch_testing import VENV_BIN


def processes_under(path) -> list[str]:
    """Processes whose command line or working directory mentions `path`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # the process ended while we looked, or is not ours to read
        if state != "Z" and (str(path) in cmd or cwd.startswith(str(path))):
            found.append(f"{pid}: {cmd[:200]} (cwd {cwd})")
    return found


def run_until(cmd: list[str], marker: str, timeout: float) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    assert any(marker in x for x in seen), "".join(seen)
    return proc, seen


def assert_all_stopped(proc, seen, sig, run_dir, what: str) -> str:
    assert processes_under(run_dir), f"{what} should have processes running now"
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, "".join(seen) + rest
    assert f"interrupted ({signal.Signals(sig).name})" in rest
    deadline = time.monotonic() + 5
    while processes_under(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(run_dir) == []
    return rest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_demo_stops_everything_it_started_while_devices_run(tmp_path, sig):
    run_dir = tmp_path / "demo"
    proc, seen = run_until(
        [str(VENV_BIN / "mqbatch"), "demo", "--devices", "2", "--duration", "60", "--run-dir", str(run_dir)],
        "devices running",
        120,
    )
    assert_all_stopped(proc, seen, sig, run_dir, "the demo (broker, relay, devices, recorder)")


@pytest.mark.slow
def test_demo_sigterm_while_spark_runs_leaves_no_broker_nor_spark_job(tmp_path):
    run_dir = tmp_path / "demo"
    proc, seen = run_until(
        [
            str(VENV_BIN / "mqbatch"),
            "demo",
            "--devices",
            "1",
            "--duration",
            "4",
            "--outage-s",
            "0",
            "--cut-s",
            "0",
            "--no-baseline",
            "--run-dir",
            str(run_dir),
        ],
        "Spark job running",
        300,
    )
    running = "\n".join(processes_under(run_dir))
    assert "mosquitto" in running and "spark" in running, running
    assert_all_stopped(proc, seen, signal.SIGTERM, run_dir, "the demo (broker, Spark job)")


@pytest.mark.broker
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_devices_stops_its_broker_and_devices(tmp_path, sig):
    run_dir = tmp_path / "devs"
    proc, seen = run_until(
        [str(VENV_BIN / "mqbatch"), "devices", "--count", "1", "--duration", "60", "--dir", str(run_dir)],
        "running",
        120,
    )
    assert_all_stopped(proc, seen, sig, run_dir, "mqbatch devices (broker, devices)")
