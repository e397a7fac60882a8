# mqtt_heap: the device client + encoder with a 4 KB batch buffer over (mutual) TLS,
# as small as an application would hold them, for `micropython -X heapsize=64K` (run
# from .mpy, see tests/firmware/test_mqtt_resources.py). Prints "key value" lines.
# Boot order matters in a small heap: the long-lived large objects (batch buffer,
# TLS context) are made before the rest of the code is imported, so they do not
# have to fit in the gaps between loaded modules.
# Usage: micropython -m mqtt_heap HOST PORT CA CERT KEY BATCHES
import gc
import sys
import micropython

gc.collect()
print("heap_start", gc.mem_alloc())
# large buffers first, before the heap fragments (usual MicroPython practice)
BUF = bytearray(4096 + 80)
from mqb_transport import Transport
HOST, PORT, CA, CERT, KEY, BATCHES = sys.argv[1:7]
NET = Transport(HOST, int(PORT), cafile=CA, certfile=CERT, keyfile=KEY, server_hostname="localhost")
from mqb_codec import BatchEncoder
from mqb_client import Client

gc.collect()
print("heap_modules", gc.mem_alloc())
acked = [0, 0]


def on_ack(pid, code, reason):
    acked[0 if code < 0x80 else 1] += 1


def main():
    topic = b"mqbatch/device-1/telemetry"
    c = Client(NET, b"device-1", keepalive=60, on_ack=on_ack)
    enc = BatchEncoder(BUF, headroom=80)
    c.connect()
    gc.collect()
    print("heap_connected", gc.mem_alloc())
    c.apply_budget(enc, topic, 1)
    record = bytearray(24)
    for b in range(int(BATCHES)):
        enc.reset()
        record[0] = b & 0xFF
        while enc.add(record):
            pass
        c.publish_batch(enc, topic, 1)
        c.flush()
    gc.collect()
    print("heap_after_publish", gc.mem_alloc())
    # steady state: no allocation per publish
    gc.disable()
    before = gc.mem_alloc()
    for b in range(50):
        c.publish_batch(enc, topic, 1)
        c.flush()
    print("alloc_50_publishes", gc.mem_alloc() - before)
    gc.enable()
    c.disconnect()
    print("acked", acked[0], "refused", acked[1])
    print("heap_peak", micropython.mem_peak())
    print("heap_total", gc.mem_alloc() + gc.mem_free())


main()
