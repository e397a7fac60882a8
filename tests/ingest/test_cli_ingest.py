"""`mqbatch ingest` against a real Mosquitto (TLS, passwords, ACL): an account that
may not read the topic gets "granted QoS 1" and then nothing, forever; the recorder
says so loudly instead of recording nothing in silence. SIGHUP (a closed terminal)
stops it cleanly like SIGTERM."""

import signal
import ssl
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch_testing import VENV_BIN

pytestmark = pytest.mark.broker

USERS = {"recorder": "rec-secret", "publisher": "pub-secret"}


def broker_with(mosquitto, recorder_reads: str):
    acl = f"user recorder\ntopic read {recorder_reads}\n\nuser publisher\ntopic write mqbatch/#\n"
    return mosquitto(tls=True, allow_anonymous=False, users=USERS, acl=acl)


def start_recorder(broker, pki, tmp_path, *extra) -> tuple[subprocess.Popen, object]:
    pw = tmp_path / "recorder.pw"
    pw.write_text(USERS["recorder"])
    log = tmp_path / "recorder.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "mqbatch"),
                "ingest",
                "--host",
                broker.host,
                "--port",
                str(broker.port),
                "--cafile",
                str(pki.ca_cert),
                "--username",
                "recorder",
                "--password-file",
                str(pw),
                "--landing",
                str(tmp_path / "landing"),
                "--progress-seconds",
                "1",
                *extra,
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    read = lambda: log.read_text(errors="replace")
    deadline = time.monotonic() + 30
    while "subscribed $share/" not in read():
        assert proc.poll() is None and time.monotonic() < deadline, read()
        time.sleep(0.05)
    return proc, read


def publish_for(broker, pki, seconds: float) -> int:
    """Publish QoS 1 to mqbatch/dev-001/telemetry every 0.1 s; returns how many the broker acknowledged."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pub-1", protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(pki.ca_cert), cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set("publisher", USERS["publisher"])
    connected = threading.Event()
    c.on_connect = lambda client, userdata, flags, rc, props: connected.set()
    c.connect(broker.host, broker.port, keepalive=30)
    c.loop_start()
    assert connected.wait(10)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        c.publish("mqbatch/dev-001/telemetry", b"x", qos=1).wait_for_publish(10)
        n += 1
        time.sleep(0.1)
    c.disconnect()
    c.loop_stop()
    return n


def stop(proc, sig=signal.SIGTERM) -> int:
    proc.send_signal(sig)
    return proc.wait(30)


def test_a_recorder_that_may_not_read_the_topic_warns_loudly(mosquitto, pki, tmp_path):
    broker = broker_with(mosquitto, "other/#")  # the recorder's account reads nothing under mqbatch/
    proc, log = start_recorder(broker, pki, tmp_path, "--silence-warn-s", "2")
    try:
        assert "granted QoS 1" in log()  # what used to be the last word
        assert publish_for(broker, pki, 3.5) > 10
        out = log()
        assert "WARNING: no PUBLISH for 2 s since subscribing on $share/mqbatch-recorders/mqbatch/+/telemetry" in out, (
            out
        )
        assert "account 'recorder'" in out and "topic read mqbatch/+/telemetry" in out
    finally:
        assert stop(proc) == 0, log()
    assert "0 PUBLISHes landed" in log()


def test_a_recorder_that_receives_gives_no_warning_and_stops_on_sighup(mosquitto, pki, tmp_path):
    broker = broker_with(mosquitto, "mqbatch/#")
    proc, log = start_recorder(broker, pki, tmp_path, "--silence-warn-s", "2")
    try:
        sent = publish_for(broker, pki, 3.5)
        time.sleep(0.5)
        assert "WARNING" not in log(), log()
    finally:
        code = stop(proc, signal.SIGHUP)
    assert code == 0, log()
    assert "SIGHUP: closing the open landing file" in log()
    assert f"stopped: {sent} PUBLISHes landed" in log(), log()
