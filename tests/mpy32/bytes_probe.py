# bytes_probe: the bytes the firmware produces, printed as "NAME HEX" lines, for
# test_wasm32.py to compare between the 64-bit Unix port and the 32-bit wasm port.
# Deterministic: fixed clock, keys, payloads; values at the i32 and u32 edges
# (long ints on 32-bit). Usage: micropython bytes_probe.py TMPDIR
import sys
from array import array
from binascii import crc32, hexlify

import mqb_packet as P
import mqb_packet_build as B
from mqb_codec import BatchEncoder
from mqb_hmac import BatchMac
from mqb_outbox import Outbox
from mqb_record import RecordWriter, TickClock


def out(name, data):
    print(name, hexlify(bytes(data)).decode())


def main(tmp):
    ticks = [1000]
    clock = TickClock(lambda: ticks[0], lambda a, b: a - b)
    clock.set(0x3FFFFFF0 // 40, 999, True)  # a second count near the format's limit
    enc = BatchEncoder(bytearray(4096), headroom=256, max_count=100)
    w = RecordWriter(enc, clock, boot=0xFFFFFFF0)  # a boot number above 2**31: a long int on 32-bit
    vals = array("i", [-2147483648, 2147483647, 0x3FFFFFFF, -0x40000000, 1, -1])
    for i in range(20):
        ticks[0] += 997 * i
        vals[4] = i * 123457
        assert w.sample((1, 2, 3, 4, 5, 6), vals) >= 0
    assert w.health((0x80, 0x81, 0x82), array("i", [2147483647, -5, 0x7FFF])) >= 0
    payload = memoryview(enc.buf)[enc.headroom : enc.end]
    out("batch_payload", payload)
    out("batch_crc32", crc32(payload).to_bytes(4, "big"))
    out("crc32_chain", crc32(b"tail", crc32(payload)).to_bytes(4, "big"))

    topic = b"mqbatch/dev-001/telemetry"
    mac = BatchMac(bytes(range(32)))
    out("hmac", mac.sign(topic, enc.count, payload))
    B.batch_mac = mac.hex  # the PUBLISH carries the last MAC
    try:
        start = B.write_publish_header(
            enc.buf, enc.headroom, 0x02, topic, len(topic), 0xFFFF, 0, 4294967295, b"application/x-mqbatch", 0, enc
        )
    finally:
        B.batch_mac = None
    out("publish", memoryview(enc.buf)[start : enc.end])
    will = B.Will(b"mqbatch/dev-001/status", b"offline", 1, True, 30, 4294967295)
    out(
        "connect",
        B.connect_packet(b"dev-001", 65535, True, 4294967295, 65535, 268435455, b"dev-001", b"secret", will, 10),
    )
    ack = bytearray(8)
    out("pubrel", ack[: B.ack_packet(ack, P.PUBREL, 0xFFFF, 0x92)])

    ob = Outbox(tmp + "/ob", segment_size=4096, max_segments=4, max_entries=16)
    for i in range(12):
        ob.append(bytes(payload[: 50 + 40 * i]), i + 1, 0xFFFFFFF0, 0x3FFFFFF0 + i, 0x40000010 + i)
    ob.ack(0)
    ob.ack(3)
    ob.close()
    import os

    for name in sorted(os.listdir(tmp + "/ob")):
        with open(tmp + "/ob/" + name, "rb") as f:
            out("outbox_file_" + name, f.read())


main(sys.argv[1])
