# record_bench: one run of the device pipeline in the MicroPython Unix port, for
# `mqbatch bench device`: RecordWriter.sample -> BatchEncoder -> mqb_client (QoS 1).
# Records of 4 channels (38 bytes), batches of 100. Prints one JSON line:
#   us_per_sample: RecordWriter.sample per record, no network (GC enabled)
#   alloc_per_record: heap bytes per sample() with the GC disabled (after a warm-up)
#   us_per_publish: publish_batch of one 100-record batch (sending, not the PUBACK wait)
#   records_per_s: sample x 100 + publish_batch + flush(), QoS 1, records per second
#   app_records_per_s (with OUTBOX_DIR): the application's per-record path: sample x 100,
#     Outbox.append of the batch (written and flushed to its segment file, as App._seal),
#     Outbox.read back into the send encoder (as App._load), publish_batch, flush() (the
#     PUBACK), Outbox.ack; records per second
#   app_parts_us_per_record: the same path by step (PARTS), us per record
#   app_heap_bytes_per_batch: the same path by step with the GC disabled, heap bytes per
#     100-record batch (gc.mem_alloc() around each step)
#   lfs_*: the same path timed with the outbox on littlefs (os.VfsLfs2, the boards'
#     filesystem) over lfs_flash.RAMFlash (a flash stand-in in Python, 64 x 4 KiB blocks):
#     records per second, us per record by step, and the flash traffic per batch (bytes
#     programmed, blocks erased). CPU only: a real flash adds its program and erase time.
#     Its heap is not reported: the Python stand-in allocates where a board's C driver does not.
# Usage: micropython record_bench.py HOST PORT CA|- BATCHES [OUTBOX_DIR]
import gc
import json
import sys
import time
from bench_records import batch_filler
from mqb_transport import Transport
from mqb_client import Client

host, port, ca, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
TOPIC = b"mqbatch/bench/telemetry"
# the steps of the app path: sample x 100; Outbox.append (write + flush: fsync on this port);
# Outbox.read + load into the send encoder; publish_batch (sending); flush() (the PUBACK's
# round trip); Outbox.ack (a 4-byte ack record + flush: fsync)
PARTS = ("sample", "append+fsync", "read", "publish", "puback_wait", "ack+fsync")
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

tr = (
    Transport(host, port, cafile=ca, server_hostname="localhost")
    if ca != "-"
    else Transport(host, port, plain_tcp=True)
)
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
result = {
    "tls": ca != "-",
    "batches": batches,
    "record_bytes": 38,
    "us_per_sample": us_sample,
    "alloc_per_record": alloc / (batches * PER_BATCH),
    "us_per_publish": pub_us / batches,
    "records_per_s": batches * PER_BATCH * 1e6 / dt,
}

if len(sys.argv) > 5:
    import os
    from mqb_codec import BatchEncoder
    from mqb_outbox import Outbox
    from lfs_flash import RAMFlash, mount

    outbox = Outbox(sys.argv[5])
    out = BatchEncoder(bytearray(4096 + 80), headroom=80, max_count=PER_BATCH)
    out_view = memoryview(out.buf)[80:]
    seq = [0]

    def app_path(k, now, diff, acc):
        """k batches of the app path through `outbox`; acc[i] += diff(end, start) of step i (PARTS),
        `now()` read between the steps: time.ticks_us (us) or gc.mem_alloc (heap bytes, GC off)."""
        b = 0
        t0 = now()
        while b < k:  # each step from the previous one's end: together they cover the loop
            fill()
            t1 = now()
            eid = outbox.append(enc.payload(), enc.count, 1, seq[0], seq[0] + PER_BATCH - 1)
            if eid < 0:
                raise RuntimeError("outbox refused the batch: %d" % eid)
            seq[0] += PER_BATCH
            t2 = now()
            n = outbox.read(eid, out_view)
            if n < 0:
                raise RuntimeError("outbox entry %d unreadable: %d" % (eid, n))
            out.load(n, outbox.entry_records)
            t3 = now()
            if client.publish_batch(out, TOPIC, 1) < 0:
                raise RuntimeError("publish_batch did not send")
            t4 = now()
            if client.flush(10000):
                raise RuntimeError("no PUBACK within 10 s")
            t5 = now()
            outbox.ack(eid)
            t6 = now()
            acc[0] += diff(t1, t0)
            acc[1] += diff(t2, t1)
            acc[2] += diff(t3, t2)
            acc[3] += diff(t4, t3)
            acc[4] += diff(t5, t4)
            acc[5] += diff(t6, t5)
            t0 = t6  # (this bookkeeping is measured with the next sample step: < 0.1 %, no heap)
            b += 1

    def timed(prefix):
        """app_path over `batches` batches after a warm-up: records/s and us per record by step."""
        parts = [0] * 6  # us per step, summed over the timed batches (PARTS)
        app_path(5, time.ticks_us, time.ticks_diff, parts)  # warm-up
        parts[:] = [0] * 6
        t0 = time.ticks_us()
        app_path(batches, time.ticks_us, time.ticks_diff, parts)
        result[prefix + "records_per_s"] = batches * PER_BATCH * 1e6 / time.ticks_diff(time.ticks_us(), t0)
        result[prefix + "parts_us_per_record"] = [[PARTS[i], parts[i] / (batches * PER_BATCH)]
                                                  for i in range(len(PARTS))]

    timed("app_")

    # the same path with the GC off: heap bytes each step allocates, per batch; over
    # ALLOC_BATCHES batches, so that the outbox opens and deletes segment files on the way
    # as it does in a run
    ALLOC_BATCHES = 24
    heap = [0] * 6

    def minus(a, b):
        return a - b

    gc.collect()
    gc.disable()
    app_path(ALLOC_BATCHES, gc.mem_alloc, minus, heap)
    gc.enable()
    result["app_heap_bytes_per_batch"] = [[PARTS[i], heap[i] / ALLOC_BATCHES] for i in range(len(PARTS))]
    outbox.close()

    # the same path, the outbox on littlefs (the boards' filesystem) over a RAM flash stand-in
    flash = RAMFlash(4096, 64)
    os.VfsLfs2.mkfs(flash)
    mount(flash, "/bench_flash")
    outbox = Outbox("/bench_flash/outbox")
    ops = (flash.prog_bytes, flash.erases)
    timed("lfs_")
    n = batches + 5
    result["lfs_flash_per_batch"] = {"bytes_programmed": (flash.prog_bytes - ops[0]) / n,
                                     "blocks_erased": (flash.erases - ops[1]) / n}
    outbox.close()
    os.umount("/bench_flash")
client.disconnect()
print(json.dumps(result))
