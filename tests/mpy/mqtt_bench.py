# mqtt_bench: one benchmark run in the MicroPython Unix port, for tools/bench_mqtt.py.
# Publishes N times the same batch (100 x 24-byte records, 2,500 payload bytes) with
# either this project's client (mqb) or umqtt.simple, and prints one JSON line:
#   alloc_per_publish: heap bytes per publish with the GC disabled (after a warm-up)
#   publishes_per_s: publish rate with the GC enabled (QoS 1: until each PUBACK)
# CLIENT mqb waits for each PUBACK with client.flush() (stop-and-wait through
# Transport.wait); mqb-busy spins on client.service() instead (the ceiling flush
# is compared with by `mqbatch bench device`).
# Usage: micropython mqtt_bench.py CLIENT(mqb|mqb-busy|umqtt) HOST PORT CA|- QOS N
import gc
import json
import sys
import time

kind, host, port, ca, qos, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
TOPIC = b"mqbatch/bench/telemetry"
tls = ca != "-"

if kind in ("mqb", "mqb-busy"):
    from mqb_codec import BatchEncoder
    from mqb_transport import Transport
    from mqb_client import Client

    enc = BatchEncoder(bytearray(4096 + 80), headroom=80)
    for i in range(100):
        enc.add(bytes([i]) * 24)
    tr = Transport(host, port, cafile=ca, server_hostname="localhost") if tls else Transport(host, port, plain_tcp=True)
    client = Client(tr, b"bench-mqb", keepalive=0)
    client.connect()

    def publish():
        if client.publish_batch(enc, TOPIC, qos) < 0:
            raise RuntimeError("publish_batch did not send")
        if not qos:
            return
        if kind == "mqb":
            if client.flush(10000):
                raise RuntimeError("no PUBACK within 10 s")
            return
        t0 = time.ticks_ms()
        while client.service() > 0:
            if time.ticks_diff(time.ticks_ms(), t0) > 10000:
                raise RuntimeError("no PUBACK within 10 s")
    payload_len = enc.payload_len
else:
    from umqtt.simple import MQTTClient

    params = {}
    if tls:
        import ssl
        with open(ca, "rb") as f:
            params = {"cert_reqs": ssl.CERT_REQUIRED, "cadata": f.read(), "server_hostname": "localhost"}
    payload = b"".join(bytes([24]) + bytes([i]) * 24 for i in range(100))  # the same bytes as the batch
    client = MQTTClient(b"bench-umqtt", host, port, ssl=tls, ssl_params=params)
    client.connect()

    def publish():
        client.publish(TOPIC, payload, qos=qos)
    payload_len = len(payload)


def loop(k):
    i = 0
    while i < k:
        publish()
        i += 1


loop(20)  # warm-up: one-time allocations (poll tuples, caches) happen here
gc.collect()
gc.disable()
before = gc.mem_alloc()
loop(n)
alloc = gc.mem_alloc() - before
gc.enable()
gc.collect()
t0 = time.ticks_us()
loop(n)
dt = time.ticks_diff(time.ticks_us(), t0)
client.disconnect()
print(json.dumps({"client": kind, "tls": tls, "qos": qos, "n": n, "payload": payload_len,
                  "alloc_per_publish": alloc / n, "publishes_per_s": n * 1e6 / dt}))
