"""A small third-party batch publisher (paho-mqtt, MQTT 5) for the conformance harness's
command adapter: `mqbatch conformance publisher --cmd "python -m mqbatch.conformance_paho"`.

It reads the MQBATCH_* environment (see mqbatch.conformance), connects, publishes
one batch-format v1 batch of 10 records every 0.3 s for MQBATCH_DURATION_S seconds
with the User Properties batch-format=v1 and batch-size=N, waits for its
acknowledgements, disconnects and exits 0 (1 if some were not acknowledged).
paho-mqtt keeps QoS 1/2 messages and resends them with DUP after a resumed session.
"""
from __future__ import annotations

import os
import sys
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch import codec


def main() -> int:
    env = os.environ
    host, port = env["MQBATCH_HOST"], int(env["MQBATCH_PORT"])
    topic, qos = env["MQBATCH_TOPIC"], int(env.get("MQBATCH_QOS", "1"))
    duration = float(env.get("MQBATCH_DURATION_S", "4"))
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=env.get("MQBATCH_CLIENT_ID", "paho-batch"),
                    protocol=mqtt.MQTTv5)
    c.reconnect_delay_set(0.1, 0.5)
    cp = Properties(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = int(env.get("MQBATCH_SESSION_EXPIRY_S", "0"))
    c.connect(host, port, keepalive=10, clean_start=True, properties=cp)
    c.loop_start()
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
    while time.monotonic() < deadline and not all(i.is_published() for i in infos):
        time.sleep(0.1)
    done = sum(1 for i in infos if i.is_published())
    c.disconnect()
    c.loop_stop()
    print(f"paho batch publisher: {n} batches, {done} acknowledged")
    return 0 if done == n else 1


if __name__ == "__main__":
    sys.exit(main())
