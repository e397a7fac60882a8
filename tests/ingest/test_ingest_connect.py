"""Issue 23.3 (B): the recorder retries its first connection like every later one.
`mqbatch ingest` started while the broker is down (or flooded) used to exit 1 on
its first failed connect and stay down; now it waits with back-off, logs one
line per state change, and lands once the broker is up. Refused credentials are
bad configuration: one clear line, exit status 2, at once."""

from __future__ import annotations

import subprocess
import time

import pytest
from test_ingest import ACL, USERS, publisher

from mqbatch.ingest import landing
from mqbatch_testing import VENV_BIN

pytestmark = pytest.mark.broker


def ingest(broker, pki, tmp_path, password: str) -> tuple[subprocess.Popen, object]:
    pw = tmp_path / "recorder.pw"
    pw.write_text(password)
    log = tmp_path / "recorder.log"
    cmd = [str(VENV_BIN / "mqbatch"), "ingest", "--host", broker.host, "--port", str(broker.port)]
    cmd += ["--cafile", str(pki.ca_cert), "--username", "recorder", "--password-file", str(pw)]
    cmd += ["--landing", str(tmp_path / "landing"), "--client-id", "rec-1", "--progress-seconds", "1"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, lambda: log.read_text(errors="replace")


def wait_for(cond, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_recorder_started_before_the_broker_waits_and_then_lands(mosquitto, pki, tmp_path):
    broker = mosquitto(tls=True, allow_anonymous=False, users=USERS, acl=ACL, persistence=True, start=False)
    proc, out = ingest(broker, pki, tmp_path, USERS["recorder"])
    try:
        wait_for(lambda: "cannot connect to" in out() or proc.poll() is not None, 60, out)
        time.sleep(4.0)  # more attempts (1 s, then 2 s later): all refused
        assert proc.poll() is None, f"exited {proc.returncode}:\n{out()}"
        assert out().count("cannot connect to") == 1, out()  # one line for the state, not one per attempt
        assert "Errno 111" in out() and "retrying with back-off" in out()
        broker.start()
        wait_for(lambda: "subscribed $share/" in out(), 40, out)  # next attempt within 4 s of back-off
        assert "reachable again" in out()
        pub = publisher(broker, pki)
        pub.publish("mqbatch/dev-001/telemetry", b"after the wait", qos=1).wait_for_publish(10)
        pub.disconnect()
        pub.loop_stop()
        wait_for(lambda: "1 PUBLISHes landed" in out(), 15, out)
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, out()
    assert landing.read_landing(tmp_path / "landing").column("payload").to_pylist() == [b"after the wait"]


def test_refused_credentials_fail_fast_as_bad_configuration(mosquitto, pki, tmp_path):
    broker = mosquitto(tls=True, allow_anonymous=False, users=USERS, acl=ACL)
    proc, out = ingest(broker, pki, tmp_path, "not-the-password")
    try:
        code = proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 2, out()
    lines = [line for line in out().splitlines() if "error:" in line]
    assert (
        len(lines) == 1 and "Not authorized (0x87)" in lines[0]
    )  # Mosquitto 2.0.11 answers a wrong password so, out()
