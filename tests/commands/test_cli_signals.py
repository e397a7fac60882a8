"""Ctrl-C (SIGINT), `kill` (SIGTERM) and a closed terminal (SIGHUP) stop every long-running
command the same way: every process it started (Mosquitto, the relay, devices, the
recorder, the Spark job and its JVM) is stopped, nothing is left behind, the exit status
is 128 + the signal number (0 for `ingest` and `vboard`, which treat a signal as their
normal end), and nothing prints a traceback: demo, devices, spark, ingest, fleet run,
vboard."""

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
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_devices_stops_its_broker_and_devices(tmp_path, sig):
    run_dir = tmp_path / "devs"
    proc, seen = run_until(
        [str(VENV_BIN / "mqbatch"), "devices", "--count", "1", "--duration", "60", "--dir", str(run_dir)],
        "running",
        120,
    )
    assert_all_stopped(proc, seen, sig, run_dir, "mqbatch devices (broker, devices)")


# -- issue 26: no traceback on Ctrl-C from any long-running command -------------------------


def sigint_after(cmd: list[str], marker: str, timeout: float, settle: float = 0.0):
    """Start `cmd`, wait for `marker` in its output (+ `settle` s), SIGINT it as a terminal's
    Ctrl-C would; returns (exit status, everything it printed)."""
    proc, seen = run_until(cmd, marker, timeout)
    time.sleep(settle)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    assert "Traceback" not in out and "Exception" not in out, out
    return proc.returncode, out


@pytest.mark.slow
def test_spark_ctrl_c_prints_no_py4j_traceback(tmp_path):
    """The driver, waiting in a py4j call, used to print py4j ERROR tracebacks (and a
    BrokenPipeError) before the clean last line: they now go to a file the line names."""
    from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

    rows = [landed("mqbatch/dev-001/telemetry", [sample(1, s)[0] for s in range(10)], T0_MS + 60_000)]
    write_landing(tmp_path / "landing", "rec-1", 1, rows)
    out_dir = tmp_path / "out"
    code, out = sigint_after(
        [str(VENV_BIN / "mqbatch"), "spark", "--landing", str(tmp_path / "landing"), "--out", str(out_dir)],
        "WARN",  # the JVM is up; the driver is starting its SparkSession over py4j
        180,
        settle=4,
    )
    assert code == 128 + signal.SIGINT, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("mqbatch spark: stopped by SIGINT; spark-submit and its children ended"), out
    assert processes_under(out_dir) == []


@pytest.mark.broker
def test_ingest_ctrl_c_closes_the_landing_file_without_a_traceback(tmp_path):
    from mqbatch.lab.stack import LocalStack

    stack = LocalStack(tmp_path / "stack", ["dev-001"])
    user, password = stack.recorder_login
    (tmp_path / "pw").write_text(password)
    with stack.broker as broker:
        code, out = sigint_after(
            [
                str(VENV_BIN / "mqbatch"),
                "ingest",
                "--port",
                str(broker.port),
                "--cafile",
                str(stack.ca_cert),
                "--username",
                user,
                "--password-file",
                str(tmp_path / "pw"),
                "--landing",
                str(tmp_path / "landing"),
            ],
            "subscribed",
            60,
        )
    assert code == 0 and "SIGINT: closing the open landing file" in out, out


def test_fleet_run_ctrl_c_stops_its_devices_without_a_traceback(tmp_path):
    """`fleet run` had no signal handling: Ctrl-C printed a KeyboardInterrupt traceback.
    No broker is needed: the devices sample into their flash and retry the connection."""
    from mqbatch.lab.broker import free_port

    fleet, run_dir = tmp_path / "fleet", tmp_path / "run"
    mq = str(VENV_BIN / "mqbatch")
    port = str(free_port())
    init = [mq, "fleet", "init", str(fleet), "--broker-host", "127.0.0.1", "--port", port]
    assert subprocess.run(init, capture_output=True).returncode == 0
    assert subprocess.run([mq, "fleet", "add", str(fleet), "porch-1"], capture_output=True).returncode == 0
    cmd = [mq, "fleet", "run", str(fleet), "porch-1", "--duration", "60", "--run-dir", str(run_dir)]
    code, out = sigint_after(cmd, "devices running", 120)
    assert code == 128 + signal.SIGINT, out
    assert "fleet run: interrupted (SIGINT); its devices have been stopped" in out
    assert processes_under(run_dir) == []


def test_vboard_foreground_ctrl_c_stops_the_board_without_a_traceback(tmp_path):
    code, out = sigint_after(
        [str(VENV_BIN / "mqbatch"), "vboard", "start", "--dir", str(tmp_path / "flash"), "--foreground"], "up", 60
    )
    assert code == 0, out
    assert processes_under(tmp_path / "flash") == []


def test_a_stop_signal_inside_the_events_own_wait_does_not_deadlock():
    """A Python signal handler runs in the main thread between two bytecodes, also while
    Event.wait() holds the Event's lock: a handler that called Event.set() then waited for
    that lock forever (`vboard start --foreground` hung once after Ctrl-C in CI). Here the
    handler runs while the same thread holds the lock, as it would inside wait(): it must
    return at once, and the event is set once the lock is free. Fails with a handler that
    sets the event itself."""
    import threading

    from mqbatch.util.procs import SignalStop

    said: list[str] = []
    stop = SignalStop(say=said.append)
    returned = threading.Event()

    def main_thread_in_wait():
        with stop.event._cond:  # what Event.wait() holds between its checks
            stop.handler(signal.SIGINT, None)
            returned.set()

    t = threading.Thread(target=main_thread_in_wait, daemon=True)
    t.start()
    assert returned.wait(5), "the handler blocked on the lock its own thread holds"
    assert stop.event.wait(5) and said == ["SIGINT"] and stop.names == ["SIGINT"]
    stop.handler(signal.SIGTERM, None)  # a second signal: noted, no error (the watcher is done)
    assert stop.names == ["SIGINT", "SIGTERM"]

    quiet = SignalStop()
    quiet.close()  # no signal: the watcher ends and the event stays clear
    quiet._thread.join(5)
    assert not quiet._thread.is_alive() and not quiet.event.is_set()


def test_a_signal_handlers_call_runs_in_a_thread_of_its_own():
    """vboard's SIGUSR1 (a hard reset) takes the board's lock, which the main thread holds
    while it stops the board: SignalCalls runs it in a thread, so a handler that comes while
    the lock is held returns at once and the call runs once the lock is free."""
    import threading

    from mqbatch.util.procs import SignalCalls

    lock, done = threading.Lock(), threading.Event()

    def reset():
        with lock:
            done.set()

    calls, returned = SignalCalls(reset), threading.Event()

    def main_thread_in_stop():
        with lock:  # the main thread inside stop(), holding the board's lock
            calls.handler(signal.SIGUSR1, None)  # returns: the call waits in its own thread
            returned.set()
            assert not done.is_set()

    threading.Thread(target=main_thread_in_stop, daemon=True).start()
    assert returned.wait(5), "the handler ran the call itself and blocked on the lock its thread holds"
    assert done.wait(5)
