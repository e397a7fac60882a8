"""Broker checks of spec §5 (Retain, Message Expiry) against a real Mosquitto with
paho-mqtt reference clients: {"retain": {"passed", "evidence"}, "expiry": {...}}."""

from __future__ import annotations

import pathlib
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.lab.broker import Mosquitto
from mqbatch.wire import codec

PROPS = [("batch-format", "v1"), ("batch-size", "3")]
PAYLOAD = codec.encode_payload([b"one", b"two", b"three"])


class _Client:
    def __init__(self, broker: Mosquitto, cid: str, clean: bool = True, expiry: int = 0):
        self.got: list = []
        self.ready = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
        c.on_connect = lambda *a: self.ready.set()
        c.on_message = lambda cl, u, m: self.got.append(
            (
                bytes(m.payload),
                list(getattr(m.properties, "UserProperty", []) or []),
                getattr(m.properties, "MessageExpiryInterval", None),
                bool(m.retain),
            )
        )
        cp = Properties(PacketTypes.CONNECT)
        cp.SessionExpiryInterval = expiry
        c.connect(broker.host, broker.port, keepalive=30, clean_start=clean, properties=cp)
        c.loop_start()
        if not self.ready.wait(10):
            raise RuntimeError(f"reference client {cid} could not connect to {broker.url}")
        self.c = c

    def sub(self, topic: str):
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(topic, qos=1)
        done.wait(10)

    def pub(self, topic: str, payload: bytes, retain=False, expiry=None, props=PROPS):
        p = Properties(PacketTypes.PUBLISH)
        if props:
            p.UserProperty = props
        if expiry is not None:
            p.MessageExpiryInterval = expiry
        self.c.publish(topic, payload, qos=1, retain=retain, properties=p).wait_for_publish(10)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def _wait(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.05)
    return cond()


def check_retain(broker: Mosquitto) -> dict:
    topic = "mqbatch/retain-check/telemetry"
    p = _Client(broker, "retain-pub")
    p.pub(topic, PAYLOAD, retain=True)
    late = _Client(broker, "retain-late")
    late.sub(topic)
    _wait(lambda: late.got)
    first = late.got[:1]
    p.pub(topic, b"", retain=True, props=None)  # clear
    after = _Client(broker, "retain-after")
    after.sub(topic)
    time.sleep(0.5)
    for c in (p, late, after):
        c.close()
    ok = bool(first) and first[0][0] == PAYLOAD and first[0][1] == PROPS and first[0][3] and not after.got
    return {
        "passed": ok,
        "evidence": f"late subscriber got {len(first)} retained message(s): payload identical "
        f"{bool(first) and first[0][0] == PAYLOAD}, user properties "
        f"{first[0][1] if first else None}; after the zero-byte retained PUBLISH a new "
        f"subscriber got {len(after.got)}",
    }


def check_expiry(broker: Mosquitto) -> dict:
    topic = "mqbatch/expiry-check/telemetry"
    s = _Client(broker, "expiry-sub", clean=False, expiry=600)
    s.sub(topic)
    s.close()  # away; the session keeps the subscription
    p = _Client(broker, "expiry-pub")
    p.pub(topic, PAYLOAD, expiry=1)
    p.pub(topic, PAYLOAD + b"\x01x", props=[("batch-format", "v1"), ("batch-size", "4")], expiry=60)
    p.close()
    time.sleep(2.2)
    s = _Client(broker, "expiry-sub", clean=False, expiry=0)
    _wait(lambda: s.got, 5)
    time.sleep(0.3)
    s.close()
    got = s.got
    ok = len(got) == 1 and got[0][0] == PAYLOAD + b"\x01x" and got[0][2] is not None and got[0][2] <= 60
    return {
        "passed": ok,
        "evidence": f"after 2.2 s away the subscriber got {len(got)} message(s) "
        f"(want only the 60 s one): expiry intervals {[g[2] for g in got]}",
    }


def run_broker_checks(workdir) -> dict:
    with Mosquitto(pathlib.Path(workdir) / "broker-checks") as broker:
        return {"retain": check_retain(broker), "expiry": check_expiry(broker)}
