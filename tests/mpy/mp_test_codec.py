# MicroPython tests of firmware/mqb_codec.py (run in the Unix port by tests/conftest.py).
import json
import struct
import micropython
from outbox_util import alloc_over   # bytes allocated by n calls, GC disabled
from mqb_codec import (BatchEncoder, FULL, RecordTooLarge, VBI_INCOMPLETE, VBI_MALFORMED,
                       vbi_read, vbi_size, vbi_write)


def _vectors():
    with open("../vectors/batch_v1.json") as f:
        return json.load(f)["vectors"]


def _raises(exc, fn, *args):
    try:
        fn(*args)
    except exc as e:
        return str(e)
    raise AssertionError("expected %s" % exc.__name__)


def test_vbi_round_trip_and_sizes():
    buf = bytearray(4)
    for n, size in ((0, 1), (127, 1), (128, 2), (16383, 2), (16384, 3), (2097151, 3), (2097152, 4), (268435455, 4)):
        assert vbi_size(n) == size
        end = vbi_write(buf, 0, n)
        assert end == size
        assert vbi_read(buf, 0, end) == n
        assert vbi_read(buf, 0, end - 1) == VBI_INCOMPLETE
    assert "out of range" in _raises(ValueError, vbi_size, 268435456)
    assert "out of range" in _raises(ValueError, vbi_write, buf, 0, -1)


def test_vbi_read_rejects_malformed():
    assert vbi_read(b"\xff\xff\xff\xff\x01", 0, 5) == VBI_MALFORMED
    assert vbi_read(b"\x80\x00", 0, 2) == VBI_MALFORMED
    assert vbi_read(b"\x81\x80\x00", 0, 3) == VBI_MALFORMED
    assert vbi_read(b"\x80", 0, 1) == VBI_INCOMPLETE
    assert vbi_read(b"\x00", 0, 1) == 0


def test_encoder_reproduces_shared_vectors_byte_for_byte():
    n = 0
    for v in _vectors():
        if not v["encode"]:
            continue
        msgs = [bytes.fromhex(m) for m in v["expect"]["messages_hex"]]
        enc = BatchEncoder(bytearray(70000), headroom=32, max_count=len(msgs), max_payload_bytes=65536)
        for m in msgs:
            assert enc.add(m), v["name"]
        assert enc.count == len(msgs)
        assert bytes(enc.payload()) == bytes.fromhex(v["payload_hex"]), v["name"]
        digits = bytearray(8)
        end = enc.write_count(digits, 0)
        assert bytes(digits[:end]) == str(len(msgs)).encode()
        n += 1
    assert n >= 10
    print("vectors reproduced:", n)


def test_batch_full_by_count_then_by_bytes():
    enc = BatchEncoder(bytearray(64), headroom=10, max_count=3)
    assert enc.limit == 54
    assert enc.add(b"a") and enc.add(b"b") and enc.add(b"c")
    assert enc.add(b"d") is False and enc.count == 3
    enc.reset()
    assert enc.count == 0 and enc.payload_len == 0
    enc2 = BatchEncoder(bytearray(30), headroom=10, max_count=100)  # 20-byte payload
    assert enc2.add(b"x" * 9) and enc2.add(b"y" * 9)        # 10 + 10 = 20
    assert enc2.add(b"") is False                            # even 1 byte more does not fit
    assert bytes(enc2.payload()) == b"\x09" + b"x" * 9 + b"\x09" + b"y" * 9


def test_record_that_never_fits_raises_with_sizes():
    enc = BatchEncoder(bytearray(40), headroom=8, max_count=10, max_payload_bytes=1000)
    msg = _raises(RecordTooLarge, enc.add, b"z" * 32)
    assert "32 bytes" in msg and "limit of 32" in msg, msg
    assert enc.count == 0 and enc.payload_len == 0
    enc.set_budget(10)
    msg = _raises(RecordTooLarge, enc.reserve, 10)
    assert "limit of 10" in msg, msg
    assert enc.add(b"123456789")
    assert "no room" in _raises(ValueError, enc.set_budget, 0)
    assert "headroom" in _raises(ValueError, BatchEncoder, bytearray(10), 10)


def test_reserve_and_pack_into_in_place():
    enc = BatchEncoder(bytearray(128), headroom=16, max_count=10)
    for i in range(3):
        pos = enc.reserve(6)
        assert pos != FULL
        struct.pack_into("<HI", enc.buf, pos, i, 1000 + i)
    assert bytes(enc.payload()) == b"".join(b"\x06" + struct.pack("<HI", i, 1000 + i) for i in range(3))


def test_reserve_follows_the_sizes_rule_for_every_size_and_limit():
    # reserve(n) against the rule it implements, worked out here: a sub-message takes
    # vbi_size(n) + n bytes; FULL when the count is reached or the bytes would pass the
    # limit; RecordTooLarge when they pass it in an empty batch. Sizes below 128 (a
    # record's) take a shorter path in reserve: both sides of 128, every limit near it.
    for limit in (1, 2, 50, 127, 128, 129, 130, 131, 200, 300):
        for n in list(range(0, 135)) + [250, 16383, 16384]:
            for max_count in (3, 1000):
                enc = BatchEncoder(bytearray(limit + 8), headroom=8, max_count=max_count, max_payload_bytes=limit)
                need = (1 if n < 128 else 2 if n < 16384 else 3) + n
                if need > limit:
                    assert "exceeds the batch payload limit" in _raises(RecordTooLarge, enc.reserve, n), (limit, n)
                    assert enc.count == 0 and enc.end == 8
                    continue
                used = 0
                while True:
                    pos = enc.reserve(n)
                    if enc.count == max_count and pos == FULL or used + need > limit:
                        assert pos == FULL, (limit, n, max_count, used, pos)
                        assert enc.count == used // need and enc.end == 8 + used, (limit, n, enc.count, enc.end)
                        break
                    assert pos == 8 + used + need - n, (limit, n, used, pos)
                    assert vbi_read(enc.buf, 8 + used, pos) == n
                    used += need
                    if enc.count == max_count:
                        assert enc.reserve(n) == FULL
                        break


def test_write_count_digits():
    enc = BatchEncoder(bytearray(300), max_count=200)
    buf = bytearray(4)
    for target in (1, 9, 10, 99, 100, 123):
        enc.reset()
        for _ in range(target):
            enc.add(b"")
        end = enc.write_count(buf, 1)
        assert bytes(buf[1:end]) == str(target).encode()


def test_steady_state_add_allocates_nothing():
    enc = BatchEncoder(bytearray(4096 + 64), headroom=64, max_count=100, max_payload_bytes=4096)
    rec_b = b"0123456789abcdef01234567"          # 24 bytes
    rec_ba = bytearray(rec_b)
    rec_mv = memoryview(rec_ba)
    results = {}
    for name, rec in (("bytes", rec_b), ("bytearray", rec_ba), ("memoryview", rec_mv)):
        def add_one(i, rec=rec):
            if not enc.add(rec):
                enc.reset()
                enc.add(rec)
        add_one(0)  # warm up
        results[name] = alloc_over(10000, add_one)

    def pack_one(i):
        pos = enc.reserve(24)
        if pos == FULL:
            enc.reset()
            pos = enc.reserve(24)
        struct.pack_into("<BBBBIIIHhhh", enc.buf, pos, 1, 1, 1, 3, 7, i, 200000000, 999, -1234, 5678, 42)
    pack_one(0)
    results["pack_into"] = alloc_over(10000, pack_one)
    print("ALLOC_BYTES_PER_10000_ADDS", json.dumps(results))
    for name, n in results.items():
        assert n == 0, "%s: %d bytes allocated over 10000 adds" % (name, n)


def test_add_runs_with_heap_locked():
    enc = BatchEncoder(bytearray(600), headroom=40, max_count=100)
    rec = bytearray(24)
    enc.add(rec)
    added = 0
    micropython.heap_lock()
    try:
        for _ in range(1000):
            if not enc.add(rec):
                enc.reset()
            else:
                added += 1
            pos = enc.reserve(8)
            if pos != FULL:
                struct.pack_into("<II", enc.buf, pos, 1, 2)
    finally:
        micropython.heap_unlock()
    assert added > 500
