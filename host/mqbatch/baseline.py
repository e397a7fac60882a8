"""The per-record baseline for bytes on the wire: one telemetry record per
PUBLISH, MQTT 3.1.1, QoS 1, over TLS — the traffic pattern of umqtt.simple, the
usual MicroPython client (it speaks only MQTT 3.1.1 and sends one message per
PUBLISH). umqtt.simple itself cannot be installed from PyPI here (its sdist
has no setup.py, so pip refuses it), so the same packets are sent by
paho-mqtt with protocol 3.1.1; the bytes of a QoS 1 PUBLISH, its TLS record
and the PUBACK do not depend on which client library builds them.

Measured through a counting relay: bytes sent towards the broker between the
CONNACK and the last PUBACK, divided by the number of records.
"""
from __future__ import annotations

import os
import pathlib
import ssl
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch import records
from mqbatch.netcut import Relay


class BaselineUnavailable(RuntimeError):
    pass


def measure(work_dir: os.PathLike | str, stack, *, count: int = 200) -> dict:
    """Publish `count` sample records one per PUBLISH through a relay to the
    stack's broker as its first device; return the measured figures."""
    n = count
    pathlib.Path(work_dir).mkdir(parents=True, exist_ok=True)
    dev, password = next(iter(stack.credentials.items()))
    b = stack.broker
    relay = Relay(b.host, b.port).start()
    acked = threading.Semaphore(0)
    connected = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{dev}-baseline", protocol=mqtt.MQTTv311)
    c.tls_set(ca_certs=str(stack.ca_cert), cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set(dev, password)
    c.max_inflight_messages_set(1)          # umqtt.simple waits for each PUBACK
    c.on_connect = lambda *a: connected.set()
    c.on_publish = lambda *a: acked.release()
    try:
        c.connect(relay.host, relay.port, keepalive=60)
        c.loop_start()
        if not connected.wait(15):
            raise BaselineUnavailable("baseline client could not connect")
        time.sleep(0.2)
        start = relay.bytes_up
        topic = f"mqbatch/{dev}/telemetry"
        t_ms = int(time.time() * 1000)
        for i in range(n):
            rec = records.encode_binary("sample", 1, i, t_ms + i * 100,
                                        [(1, 2150), (2, 4500), (3, 3300), (4, -55)])
            c.publish(topic, rec, qos=1)
            if not acked.acquire(timeout=15):
                raise BaselineUnavailable(f"no PUBACK for baseline record {i}")
        sent = relay.bytes_up - start
        c.disconnect()
        c.loop_stop()
    finally:
        relay.stop()
    return {"records": n, "wire_bytes": sent, "wire_bytes_per_record": sent / n,
            "record_bytes": len(rec), "client": "paho-mqtt (MQTT 3.1.1 QoS 1, umqtt.simple's traffic pattern)"}
