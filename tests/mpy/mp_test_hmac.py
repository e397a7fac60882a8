# MicroPython tests of firmware/mqb_hmac.py and the batch-hmac User Property in
# mqb_packet (run in the Unix port by tests/conftest.py).
import gc
import json
import time
from binascii import hexlify, unhexlify
import mqb_packet as P  # noqa: F401  (loaded first, as the app loads it, for the heap figures)
import mqb_packet_build as B
from mqb_codec import BatchEncoder
from mqb_hmac import BatchMac
from outbox_util import alloc_over, payload, raises


def _vectors():
    with open("../vectors/batch_hmac_v1.json") as f:
        return json.load(f)["cases"]


def test_rfc4231_vectors():
    """The HMAC itself: RFC 4231 test cases 1 and 2 (keys over 64 bytes, as in cases 6 and 7, are refused)."""
    mac = BatchMac(b"\x0b" * 20)
    assert hexlify(mac.digest(b"Hi There")) == b"b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    mac = BatchMac(b"Jefe")
    assert hexlify(mac.digest(b"what do ya ", b"want for nothing?")) == \
        b"5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert "1..64 bytes" in str(raises(ValueError, BatchMac, b"k" * 65))
    assert "1..64 bytes" in str(raises(ValueError, BatchMac, b""))


def test_device_mac_equals_the_host_vectors():
    """tests/vectors/batch_hmac_v1.json was computed on the host (integrity.sign)."""
    cases = _vectors()
    assert len(cases) >= 5
    for c in cases:
        mac = BatchMac(unhexlify(c["key"]))
        got = mac.sign(c["topic"].encode(), int(c["batch_size"]), unhexlify(c["payload"]))
        assert bytes(got) == c["batch-hmac"].encode(), (c["note"], got, c["batch-hmac"])
        # the topic's head is cached: a second batch on the same topic object is right too
        topic = c["topic"].encode()
        mac.sign(topic, 1, b"x")
        assert bytes(mac.sign(topic, int(c["batch_size"]), unhexlify(c["payload"]))) == c["batch-hmac"].encode()


def test_publish_header_carries_batch_hmac_and_counts_it():
    """With B.batch_mac set, the batch PUBLISH ends its properties with
    batch-hmac = the 64 hex digits, and every size the client computes counts it."""
    buf = bytearray(200 + 100)
    enc = BatchEncoder(buf, 200, 100, 100)
    enc.add(b"Msg1")
    enc.add(b"LongerMsg2")
    plain = B.publish_props_len(enc.count_digits(), 0, None, None, None)
    mac = BatchMac(b"k" * 32)
    mac.sign(b"mqbatch/d/telemetry", enc.count, enc.payload())
    B.batch_mac = mac.hex
    try:
        props = B.publish_props_len(enc.count_digits(), 0, None, None, None)
        assert props == plain + B.BATCH_MAC_PROPERTY_LEN, (props, plain)
        start = B.write_publish_header(buf, 200, 2, b"mqbatch/d/telemetry", 19, 7, 0, None, None, None, enc)
        head = bytes(buf[start:200])
        tail = b"\x26\x00\x0abatch-hmac\x00\x40" + bytes(mac.hex)
        assert head.endswith(b"\x26\x00\x0abatch-size\x00\x012" + tail), head
    finally:
        B.batch_mac = None
    assert B.publish_props_len(enc.count_digits(), 0, None, None, None) == plain


def test_cost_per_batch_of_100_records():
    """µs and bytes allocated per sign() of a 100-record batch (34-byte records,
    3,500-byte payload), and the RAM a BatchMac holds. Figures, not limits."""
    data = bytearray(b"".join(b"\x22" + payload(i, 34) for i in range(100)))
    view = memoryview(data)
    topic = b"mqbatch/dev-001/telemetry"
    gc.collect()
    before = gc.mem_alloc()
    mac = BatchMac(bytes(range(32)))
    mac.sign(topic, 100, view)            # the topic's head is built on the first batch
    gc.collect()
    ram = gc.mem_alloc() - before
    times = []
    for i in range(50):
        t0 = time.ticks_us()
        mac.sign(topic, 100, view)
        times.append(time.ticks_diff(time.ticks_us(), t0))
    times.sort()
    per = alloc_over(20, lambda i: mac.sign(topic, 100, view)) // 20
    one = view[:35]
    small = alloc_over(20, lambda i: mac.sign(topic, 1, one)) // 20
    print("BATCH_HMAC sign() of 100 records (%d B payload): median %d us (min %d, max %d) over 50; "
          "allocates %d B per batch (%d B for a 1-record batch); BatchMac holds %d B"
          % (len(data), times[25], times[0], times[-1], per, small, ram))
    assert per == small, (per, small)     # per batch, never per record or per payload byte
    assert per < 1024 and ram < 1024, (per, ram)


def test_config_hmac_key_is_checked():
    """config.json hmac_key: hex text of 16..64 bytes, or absent/null (unsigned)."""
    import mqb_config
    base = {"device_id": "d", "broker": {"host": "127.0.0.1", "tls": False}}
    assert mqb_config.hmac_key(mqb_config.make_config(dict(base))) is None
    cfg = mqb_config.make_config(dict(base, hmac_key="ab" * 32))
    assert mqb_config.hmac_key(cfg) == b"\xab" * 32
    for bad, msg in (("ab" * 15, "15 bytes"), ("ab" * 65, "65 bytes"), ("xyz", "hex"), (1234, "hex")):
        e = raises(mqb_config.ConfigError, mqb_config.make_config, dict(base, hmac_key=bad))
        assert msg in str(e), (bad, str(e))
