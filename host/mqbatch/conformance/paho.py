"""A small third-party batch publisher (paho-mqtt, MQTT 5) for the conformance harness's
command adapter: `mqbatch conformance publisher --cmd "python -m mqbatch.conformance.paho"`.

It reads the MQBATCH_* environment (see mqbatch.conformance.publisher), connects, publishes
one batch-format v1 batch of 10 records every 0.3 s for MQBATCH_DURATION_S seconds
with the User Properties batch-format=v1 and batch-size=N, waits for its
acknowledgements, disconnects and exits 0 (1 if some were not acknowledged).
paho-mqtt keeps QoS 1/2 messages and resends them with DUP after a resumed session.

What the harness found in paho-mqtt 2.1.0 (run on 2026-11-23, so a user of it
knows): a message published before CONNACK is sent with DUP=1 on its first
transmission, and a reconnect with Clean Start 1 resends the open messages with
DUP=1 into the new session (this publisher therefore waits for the connection and
uses Clean Start on the first connect only); with messages queued it had 2 in flight
where the server's Receive Maximum was 1; it sends QoS 1 to a server whose Maximum
QoS is 0 (Mosquitto then closes the connection and paho reconnects, again and again).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.wire import codec


def _published(info) -> bool:
    try:
        return info.is_published()
    except RuntimeError:  # paho: the publish failed (e.g. not connected); it may still be resent
        return False


def main() -> int:
    env = os.environ
    host, port = env["MQBATCH_HOST"], int(env["MQBATCH_PORT"])
    topic, qos = env["MQBATCH_TOPIC"], int(env.get("MQBATCH_QOS", "1"))
    duration = float(env.get("MQBATCH_DURATION_S", "4"))
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=env.get("MQBATCH_CLIENT_ID", "paho-batch"), protocol=mqtt.MQTTv5
    )
    c.reconnect_delay_set(0.1, 0.5)
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = int(env.get("MQBATCH_SESSION_EXPIRY_S", "0"))
    connected = threading.Event()
    c.on_connect = lambda cl, u, flags, rc, props: connected.set() if not rc.is_failure else None
    # Clean Start on the first connect only: reconnects resume the session (a reconnect with
    # Clean Start 1 would make paho resend its open messages with DUP=1 into a new session);
    # connect_async + loop_start retry a refused first connect
    c.connect_async(host, port, keepalive=10, clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY, properties=cp)
    c.loop_start()
    # publish only once connected: paho sends a message queued before CONNACK with DUP=1
    if not connected.wait(15):
        print(f"paho batch publisher: no CONNACK from {host}:{port} within 15 s")
        return 1
    infos = []
    end = time.monotonic() + duration
    n = 0
    while time.monotonic() < end:
        records = [f"paho-{n}-{i}".encode() for i in range(10)]
        payload = codec.encode_payload(records)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("batch-format", "v1"), ("batch-size", str(len(records)))]
        infos.append(c.publish(topic, payload, qos=qos, properties=props))
        n += 1
        time.sleep(0.3)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(_published(i) for i in infos):
        time.sleep(0.1)
    done = sum(1 for i in infos if _published(i))
    c.disconnect()
    c.loop_stop()
    print(f"paho batch publisher: {n} batches, {done} acknowledged")
    return 0 if done == n else 1


if __name__ == "__main__":
    sys.exit(main())
