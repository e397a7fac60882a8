# record_bench: one run of the device pipeline in the MicroPython Unix port, for
# `mqbatch bench device`: RecordWriter.sample -> BatchEncoder -> mqb_client (QoS 1).
# Records of 4 channels (38 bytes), batches of 100. Prints one JSON line:
#   us_per_sample: RecordWriter.sample per record, no network (GC enabled)
#   alloc_per_record: heap bytes per sample() with the GC disabled (after a warm-up)
#   us_per_publish: publish_batch of one 100-record batch (sending, not the PUBACK wait)
#   records_per_s: sample x 100 + publish_batch + flush(), QoS 1, records per second
# Usage: micropython record_bench.py HOST PORT CA|- BATCHES
import gc
import json
import sys
import time
from bench_records import batch_filler
from mqb_transport import Transport
from mqb_client import Client

host, port, ca, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
TOPIC = b"mqbatch/bench/telemetry"
PER_BATCH = 100
enc, fill = batch_filler(PER_BATCH, 4096 + 80)


def records_only(k):
    b = 0
    while b < k:
        fill()
        b += 1


records_only(2)  # warm-up
gc.collect()
gc.disable()
before = gc.mem_alloc()
records_only(batches)
alloc = gc.mem_alloc() - before
gc.enable()
gc.collect()
t0 = time.ticks_us()
records_only(batches)
us_sample = time.ticks_diff(time.ticks_us(), t0) / (batches * PER_BATCH)

tr = Transport(host, port, cafile=ca, server_hostname="localhost") if ca != "-" else Transport(host, port, plain_tcp=True)
client = Client(tr, b"bench-records", keepalive=0)
client.connect()
pub_us = 0


def pipeline(k):
    global pub_us
    b = 0
    while b < k:
        fill()
        t = time.ticks_us()
        if client.publish_batch(enc, TOPIC, 1) < 0:
            raise RuntimeError("publish_batch did not send")
        pub_us += time.ticks_diff(time.ticks_us(), t)
        if client.flush(10000):
            raise RuntimeError("no PUBACK within 10 s")
        b += 1


pipeline(5)  # warm-up
pub_us = 0
t0 = time.ticks_us()
pipeline(batches)
dt = time.ticks_diff(time.ticks_us(), t0)
client.disconnect()
print(json.dumps({"tls": ca != "-", "batches": batches, "record_bytes": 38, "us_per_sample": us_sample,
                  "alloc_per_record": alloc / (batches * PER_BATCH), "us_per_publish": pub_us / batches,
                  "records_per_s": batches * PER_BATCH * 1e6 / dt}))
