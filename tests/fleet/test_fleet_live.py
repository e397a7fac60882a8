"""Issue 26.3 (G): `fleet add/remove` take effect on a running broker, without a restart
(the dynamic-security plugin's control topic, as the fleet's admin account: a SIGHUP
does not reload the plugin's accounts in Mosquitto 2.0.11). A device connected before
stays connected throughout; the added device connects at once; the removed one is
disconnected and refused. The generated configuration starts without a Mosquitto
deprecation note."""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from test_fleet import start_mosquitto

from mqbatch.cli import main
from mqbatch.fleet import live
from mqbatch.fleet import provision as fleet
from mqbatch.lab.broker import free_port

pytestmark = pytest.mark.broker


class Device:
    """A paho device with its fleet config; records its CONNACKs and disconnections."""

    def __init__(self, d, dev):
        cfg = json.loads((d / "devices" / dev / "config.json").read_text())["broker"]
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=dev, protocol=mqtt.MQTTv5)
        self.c.tls_set(ca_certs=str(d / "pki" / "ca.crt"))
        self.c.username_pw_set(dev, cfg["password"])
        self.c.reconnect_delay_set(60, 60)  # no quiet reconnection behind the test's back
        self.connacks: list[str] = []
        self.disconnects: list[str] = []
        self.event = threading.Event()
        self.c.on_connect = lambda cl, u, f, rc, p: (self.connacks.append(str(rc)), self.event.set())
        self.c.on_disconnect = lambda cl, u, f, rc, p: (self.disconnects.append(str(rc)), self.event.set())
        self.c.connect(cfg["host"], cfg["port"], keepalive=5)
        self.c.loop_start()

    def wait(self, what, timeout=10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not what() and time.monotonic() < deadline:
            time.sleep(0.05)
        return what()

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def test_add_and_remove_change_the_running_broker(tmp_path, capsys):
    d, port = tmp_path / "fleet", free_port()
    assert main(["fleet", "init", str(d), "--broker-host", "127.0.0.1", "--port", str(port)]) == 0
    assert main(["fleet", "add", str(d), "dev-001"]) == 0
    assert "no broker answers at 127.0.0.1" in capsys.readouterr().out  # not running: loads the file at start
    broker = start_mosquitto(d / "broker" / "mosquitto.conf", port)
    devices = []
    try:
        time.sleep(0.5)
        log = (d / "broker" / "mosquitto.log").read_text()
        assert "Note:" not in log and "deprecated" not in log.lower(), log  # message_size_limit used to print one
        first = Device(d, "dev-001")
        devices.append(first)
        assert first.wait(lambda: first.connacks == ["Success"]), first.connacks
        assert main(["fleet", "add", str(d), "dev-002"]) == 0
        out = capsys.readouterr().out
        assert "applied to the running broker at 127.0.0.1" in out and "no restart" in out, out
        second = Device(d, "dev-002")  # no restart: the broker knows it now
        devices.append(second)
        assert second.wait(lambda: second.connacks == ["Success"]), second.connacks
        pub = second.c.publish("mqbatch/dev-002/telemetry", b"x", qos=1)
        pub.wait_for_publish(10)
        assert main(["fleet", "remove", str(d), "dev-002"]) == 0
        assert "applied to the running broker" in capsys.readouterr().out
        assert second.wait(lambda: second.disconnects), "a removed device stays connected"
        assert main(["fleet", "add", str(d), "dev-003"]) == 0 and "applied" in capsys.readouterr().out
        third = Device(d, "dev-003")
        devices.append(third)
        assert third.wait(lambda: third.connacks == ["Success"]), third.connacks
        time.sleep(1.0)
        assert first.connacks == ["Success"] and first.disconnects == [], (first.connacks, first.disconnects)
        assert broker.poll() is None  # the same broker process throughout
        # the file stays the reference: a restart gives the same accounts
        doc = json.loads((d / "broker" / "dynamic-security.json").read_text())
        assert sorted(c["username"] for c in doc["clients"]) == ["dev-001", "dev-003", live.ADMIN, "recorder"]
    finally:
        for dev in devices:
            dev.close()
        broker.terminate()
        broker.wait(10)


def test_removed_device_is_refused_at_its_next_connect(tmp_path):
    d, port = tmp_path / "fleet", free_port()
    fleet.init(d, ["127.0.0.1"], port=port)
    fleet.add(d, ["dev-001", "dev-002"])
    cfg = json.loads((d / "devices" / "dev-002" / "config.json").read_text())["broker"]
    broker = start_mosquitto(d / "broker" / "mosquitto.conf", port)
    try:
        fleet.remove(d, ["dev-002"])
        assert "applied" in fleet.live_update(d, removed=["dev-002"])
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev-002", protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=str(d / "pki" / "ca.crt"))
        c.username_pw_set("dev-002", cfg["password"])
        got = []
        c.on_connect = lambda cl, u, f, rc, p: got.append(str(rc))
        c.connect("127.0.0.1", port)
        c.loop_start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        c.loop_stop()
        assert got and got[0] != "Success", got
    finally:
        broker.terminate()
        broker.wait(10)


def test_admin_account_may_only_administer(tmp_path):
    """The admin's role: the control topic and its answers, nothing else (least privilege)."""
    fleet.init(tmp_path / "f", ["127.0.0.1"], port=18883)
    doc = json.loads((tmp_path / "f" / "broker" / "dynamic-security.json").read_text())
    role = next(r for r in doc["roles"] if r["rolename"] == f"admin:{live.ADMIN}")
    assert {(a["acltype"], a["topic"]) for a in role["acls"]} == {
        ("publishClientSend", "$CONTROL/dynamic-security/v1"),
        ("subscribeLiteral", "$CONTROL/dynamic-security/v1/response"),
        ("publishClientReceive", "$CONTROL/dynamic-security/v1/response"),
    }
