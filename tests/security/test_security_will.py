"""Issue 23.5 (E): a CONNECT whose Will targets another device's topic. Mosquitto 2.0.11
with the dynamic-security plugin accepts such a CONNECT (CONNACK 0x00: it does not
check the Will's topic at CONNECT, so refusing it there is not possible with this
broker), and checks it when the Will would be sent: the foreign Will is dropped,
never delivered nor retained. The device's own Will is delivered (the watcher can
see a Will: the check can fail). docs/security.md, "Will messages"."""

from __future__ import annotations

import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.fleet.brokerconf import Account
from mqbatch.lab.stack import LocalStack

pytestmark = pytest.mark.broker


def client(stack, client_id, username, password) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(stack.ca_cert))
    c.username_pw_set(username, password)
    return c


def connect_with_will_and_vanish(stack, will_topic: str) -> str:
    """dev-001 connects with a Will on `will_topic`, then its TCP connection drops
    without DISCONNECT (the Will is due). Returns the CONNACK reason."""
    c = client(stack, "dev-001", "dev-001", stack.credentials["dev-001"])
    c.will_set(will_topic, b"offline:" + will_topic.encode(), qos=1, retain=True)
    got: dict = {}
    done = threading.Event()

    def on_connect(cl, u, flags, rc, props):
        got["rc"] = str(rc)
        done.set()

    c.on_connect = on_connect
    c.connect(stack.broker.host, stack.broker.port, keepalive=30)
    c.loop_start()
    assert done.wait(10)
    c.loop_stop()
    c.socket().shutdown(socket.SHUT_RDWR)
    c.socket().close()
    return got["rc"]


def test_a_will_on_another_devices_topic_is_never_delivered(tmp_path):
    stack = LocalStack(tmp_path / "stack", ["dev-001", "dev-002"])
    # a watcher that may read every device's status topic (not a product account: the check's eyes)
    stack.policy._add(
        Account(
            "watcher", "watch-pw", "watcher", "writer", subscribe=("mqbatch/+/status",), receive=("mqbatch/+/status",)
        )
    )
    from mqbatch.lab.broker import Mosquitto

    broker = Mosquitto(
        tmp_path / "broker",
        certfile=stack.pki.server.cert,
        keyfile=stack.pki.server.key,
        cafile=stack.pki.ca_cert,
        **stack.policy.broker_options(),
    )
    stack.broker = broker
    with broker:
        seen: list[tuple[str, bytes]] = []
        w = client(stack, "watcher", "watcher", "watch-pw")
        subscribed = threading.Event()
        w.on_subscribe = lambda *a: subscribed.set()
        w.on_message = lambda cl, u, m: seen.append((m.topic, m.payload))
        w.connect(broker.host, broker.port, keepalive=30)
        w.loop_start()
        w.subscribe("mqbatch/+/status", qos=1)
        assert subscribed.wait(10)
        assert connect_with_will_and_vanish(stack, "mqbatch/dev-002/status") == "Success"  # not refusable here
        assert connect_with_will_and_vanish(stack, "mqbatch/dev-002/telemetry") == "Success"
        assert connect_with_will_and_vanish(stack, "mqbatch/dev-001/status") == "Success"
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        w.disconnect()
        w.loop_stop()
        assert seen == [("mqbatch/dev-001/status", b"offline:mqbatch/dev-001/status")], seen
        # nor kept as a retained message for a later subscriber
        late: list[str] = []
        w2 = client(stack, "watcher", "watcher", "watch-pw")
        w2.on_message = lambda cl, u, m: late.append(m.topic)
        w2.connect(broker.host, broker.port, keepalive=30)
        w2.loop_start()
        w2.subscribe("mqbatch/+/status", qos=1)
        time.sleep(2.0)
        w2.disconnect()
        w2.loop_stop()
        assert late == ["mqbatch/dev-001/status"], late
