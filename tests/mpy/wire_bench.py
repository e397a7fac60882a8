# wire_bench: one run of `mqbatch bench wire` in the MicroPython Unix port.
# Writes 38-byte records (4 channels) with RecordWriter and publishes them:
#   mqb    this project's client, BATCH records per PUBLISH (batch-format v1)
#   umqtt  umqtt.simple, one record per PUBLISH (BATCH must be 1)
#   umqtt-nodelay  the same with TCP_NODELAY set on its socket (its five writes per
#          PUBLISH otherwise wait for Nagle x delayed ACK)
# QoS 1 waits for each PUBACK before the next PUBLISH (mqb: flush(), umqtt.simple
# does so itself), so every PUBLISH is alone on the wire; QoS 0 only sends.
# WARM PUBLISHes first (not counted: one-time allocations, the topic alias), then
# PUBLISHES measured with the GC disabled. With SYNC 1 it prints READY before and
# DONE after the measured PUBLISHes and each time waits for a line on stdin (the
# host snapshots the proxy's counters meanwhile). At the end one JSON line:
#   records, seconds, records_per_s, alloc_per_record (heap bytes per record,
#   sample + publish + acknowledgement)
# Usage: micropython wire_bench.py KIND(mqb|umqtt|umqtt-nodelay) HOST PORT CA|- QOS BATCH WARM PUBLISHES SYNC
import gc
import json
import sys
import time
from bench_records import batch_filler

kind, host, port, ca = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
qos, batch, warm, publishes, sync = (int(a) for a in sys.argv[5:10])
tls = ca != "-"
enc, fill = batch_filler(batch, batch * 39 + 80)

if kind == "mqb":
    from mqb_transport import Transport
    from mqb_client import Client

    TOPIC = b"mqbatch/bench-wire/telemetry"
    tr = Transport(host, port, cafile=ca, server_hostname="localhost") if tls else Transport(host, port, plain_tcp=True)
    client = Client(tr, b"bench-wire", keepalive=0)

    def publish():
        fill()
        if client.publish_batch(enc, TOPIC, qos) < 0:
            raise RuntimeError("publish_batch did not send")
        if qos:
            if client.flush(10000):
                raise RuntimeError("no PUBACK within 10 s")
        else:
            client.service()
elif kind in ("umqtt", "umqtt-nodelay"):
    import umqtt.simple
    from umqtt.simple import MQTTClient

    if kind == "umqtt-nodelay":
        import socket as _socket

        class _NoDelaySockets:
            getaddrinfo = staticmethod(_socket.getaddrinfo)

            @staticmethod
            def socket(*a):
                s = _socket.socket(*a)
                s.setsockopt(6, 1, 1)   # IPPROTO_TCP, TCP_NODELAY: MicroPython has no constant for it
                return s
        umqtt.simple.socket = _NoDelaySockets

    if batch != 1:
        raise ValueError("umqtt.simple sends one record per PUBLISH: BATCH must be 1")
    TOPIC = b"bench/umqtt"
    params = {}
    if tls:
        import ssl
        with open(ca, "rb") as f:
            params = {"cert_reqs": ssl.CERT_REQUIRED, "cadata": f.read(), "server_hostname": "localhost"}
    client = MQTTClient(b"bench-wire-umqtt", host, port, ssl=tls, ssl_params=params)
    record = memoryview(enc.buf)[enc.headroom + 1:enc.headroom + 39]   # the record, without its VBI

    def publish():
        fill()
        client.publish(TOPIC, record, qos=qos)
else:
    raise ValueError("KIND is mqb, umqtt or umqtt-nodelay, not %r" % kind)



def pause(word):
    if sync:
        print(word)
        sys.stdin.readline()


client.connect()
i = 0
while i < warm:
    publish()
    i += 1
pause("READY")
before = t0 = dt = alloc = 0   # globals made before the window: a new one could grow the module dict in it
gc.collect()
gc.disable()
before = gc.mem_alloc()
t0 = time.ticks_us()
i = 0
while i < publishes:
    publish()
    i += 1
dt = time.ticks_diff(time.ticks_us(), t0)
alloc = gc.mem_alloc() - before
gc.enable()
pause("DONE")
client.disconnect()
n = publishes * batch
print(json.dumps({"kind": kind, "tls": tls, "qos": qos, "batch": batch, "records": n, "seconds": dt / 1e6,
                  "records_per_s": n * 1e6 / dt if dt else 0, "alloc_per_record": alloc / n if n else 0}))
