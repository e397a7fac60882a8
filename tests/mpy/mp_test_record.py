# MicroPython tests of firmware/mqb_record.py (run in the Unix port by tests/conftest.py).
import json
import struct
import time
import micropython
from array import array
from mqb_codec import BatchEncoder, FULL, RecordTooLarge, vbi_read, vbi_size
from mqb_boot import BootCounter
from mqb_record import HEADER_SIZE, READING_SIZE, RecordWriter, Readings, TickClock, port_epoch_to_2020
from outbox_util import TmpDir, alloc_over, str_raises

# The record format's constants (docs/records.md), stated here independently of
# mqb_record (which keeps them private: a public name costs a board's heap).
FORMAT_JSON = "json"
SEQ_LIMIT = 1 << 30
EPOCH_2020_UNIX = 1577836800
CH_TEMPERATURE, CH_HUMIDITY, CH_SUPPLY_VOLTAGE, CH_RSSI, CH_PRESSURE, CH_LIGHT = 1, 2, 3, 4, 5, 6
(CH_FREE_HEAP, CH_OUTBOX_DEPTH, CH_DROPPED_TOTAL, CH_RECONNECTS, CH_LAST_ERROR, CH_SAMPLED_TOTAL,
 CH_OUTBOX_BYTES) = 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86


class Ticks:
    """A tick source the test moves by hand (stands in for the board's ticks_ms)."""

    def __init__(self, start=0):
        self.t = start

    def ms(self):
        return self.t


def _clock(s=123456789, ms=250, synced=True, ticks=None):
    ticks = ticks or Ticks(1000)
    c = TickClock(ticks.ms, time.ticks_diff)
    c.set(s, ms, synced)
    return c, ticks


def _subs(enc):
    """The sub-messages of the batch in enc, as bytes."""
    out = []
    pos, end = enc.headroom, enc.end
    while pos < end:
        n = vbi_read(enc.buf, pos, end)
        assert n >= 0
        pos += vbi_size(n)
        out.append(bytes(enc.buf[pos:pos + n]))
        pos += n
    return out




CHANNELS = (CH_TEMPERATURE, CH_HUMIDITY, CH_SUPPLY_VOLTAGE)   # as a board's CHANNELS


def _batch_writer():
    """A 100-record, 4 KB batch encoder and a writer on the port's real clock (boot 3)."""
    enc = BatchEncoder(bytearray(4096 + 64), headroom=64, max_count=100, max_payload_bytes=4096)
    clock = TickClock()                      # the real ticks_ms of the port
    clock.set_from_rtc(True)
    return enc, RecordWriter(enc, clock, boot=3)


def _sample(t=2150, h=4500, v=3300):
    """A board's sample: its CHANNELS and the array("i") its sample() fills."""
    return CHANNELS, array("i", [t, h, v])


def _health(r, i=0):
    r.clear()
    r.add(CH_FREE_HEAP, 81234 + i)
    r.add(CH_OUTBOX_DEPTH, 3)
    r.add(CH_DROPPED_TOTAL, 17)
    r.add(CH_RECONNECTS, 2)
    r.add(CH_LAST_ERROR, -113)
    r.add(CH_SAMPLED_TOTAL, 1000 + i)
    r.add(CH_OUTBOX_BYTES, 40960)
    return r


def test_binary_sample_record_field_by_field():
    enc = BatchEncoder(bytearray(512), headroom=32)
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=7)
    assert w.sample(*_sample()) == 0
    rec = _subs(enc)[0]
    assert len(rec) == 33                       # 18 + 5 x 3 (docs/records.md)
    assert struct.unpack_from("<BBBBIIIH", rec, 0) == (1, 1, 1, 3, 7, 0, 123456789, 250)
    assert struct.unpack_from("<BiBiBi", rec, 18) == (1, 2150, 2, 4500, 3, 3300)


def test_health_record_shares_seq_and_carries_unsynced_flag():
    enc = BatchEncoder(bytearray(512), headroom=32)
    clock, ticks = _clock(s=5, ms=999, synced=False)
    w = RecordWriter(enc, clock, boot=1)
    r = Readings()
    assert w.sample(*_sample(t=-5000)) == 0
    ticks.t += 1                                 # 999 ms + 1 ms: the next second
    _health(r)
    assert w.health(r.channels, r.values, r.n) == 1
    assert w.sample((CH_RSSI, CH_PRESSURE, CH_LIGHT), [-127, 120000, 0]) == 2
    recs = _subs(enc)
    assert struct.unpack_from("<BBBBIIIH", recs[0], 0) == (1, 1, 0, 3, 1, 0, 5, 999)
    assert struct.unpack_from("<i", recs[0], 19)[0] == -5000
    h = recs[1]
    assert len(h) == 18 + 5 * 7
    assert struct.unpack_from("<BBBBIIIH", h, 0) == (1, 2, 0, 7, 1, 1, 6, 0)
    vals = [struct.unpack_from("<Bi", h, 18 + 5 * i) for i in range(7)]
    assert vals == [(0x80, 81234), (0x81, 3), (0x82, 17), (0x83, 2), (0x84, -113), (0x85, 1000), (0x86, 40960)]
    assert struct.unpack_from("<BBBB", recs[2], 0) == (1, 1, 0, 3)
    r.clear()
    assert w.health(r.channels, r.values, r.n) == 3 and len(_subs(enc)[3]) == 18   # zero readings: valid
    assert w.sample(CHANNELS, array("i", [1, 2, 3]), 2) == 4 and len(_subs(enc)[4]) == 28  # n of them


def test_full_batch_returns_FULL_and_uses_no_seq():
    enc = BatchEncoder(bytearray(32 + 70), headroom=32)      # 70-byte payload: two 34-byte sub-messages
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=2)
    c, v = _sample()
    assert w.sample(c, v) == 0 and w.sample(c, v) == 1
    assert w.sample(c, v) == FULL and w.sample(c, v) == FULL
    assert w.seq == 2 and enc.count == 2
    enc.reset()
    assert w.sample(c, v) == 2
    assert struct.unpack_from("<I", _subs(enc)[0], 8)[0] == 2
    tiny = BatchEncoder(bytearray(32 + 30), headroom=32)
    w2 = RecordWriter(tiny, clock, boot=2)
    msg = str_raises(RecordTooLarge, w2.sample, c, v)
    assert "33 bytes" in msg, msg
    assert w2.seq == 0 and tiny.count == 0


def test_bad_readings_get_clear_errors():
    enc = BatchEncoder(bytearray(512), headroom=32)
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=1)
    assert "0x80 not allowed in a sample" in str_raises(ValueError, w.sample, (CH_FREE_HEAP,), [1])
    assert "0x01 not allowed in a health" in str_raises(ValueError, w.health, (CH_TEMPERATURE,), [1])
    assert "0x07 not allowed" in str_raises(ValueError, w.sample, (7,), [1])
    assert "appears twice" in str_raises(ValueError, w.sample, (1, 2, 1), [1, 2, 3])
    assert "fixed-point int" in str_raises(TypeError, w.sample, (1, 2), [2150, 21.5])
    assert "i32" in str_raises(ValueError, w.sample, (2,), [1 << 31])
    assert "must hold them" in str_raises(ValueError, w.sample, (1, 2, 3), [1, 2])
    assert "0..32 allowed" in str_raises(ValueError, w.health, bytes(40), [0] * 40)
    r = Readings()
    assert "u8" in str_raises(ValueError, r.add, 256, 1)
    assert "1..32" in str_raises(ValueError, Readings, 33)
    small = Readings(2)
    small.add(CH_TEMPERATURE, 1)
    small.add(CH_HUMIDITY, 1)
    assert "at most 2" in str_raises(ValueError, small.add, CH_LIGHT, 1)
    assert "record_format" in str_raises(ValueError, RecordWriter, enc, clock, 1, "xml")
    assert enc.count == 0 and w.seq == 0          # nothing was written, no seq used


def test_checks_hold_after_the_channel_layout_is_cached():
    # A channel tuple is validated once per (tuple, n, kind); values are checked every record,
    # and a mutable channel list (Readings.channels) is validated every time.
    enc = BatchEncoder(bytearray(512), headroom=32)
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=1)
    c, v = _sample()
    assert w.sample(c, v) == 0                                   # layout of CHANNELS now cached
    assert "fixed-point int" in str_raises(TypeError, w.sample, c, [2150, 21.5, 3300])
    assert "i32" in str_raises(ValueError, w.sample, c, [1, 1 << 31, 3])
    assert "must hold them" in str_raises(ValueError, w.sample, c, [1, 2])
    assert "not allowed in a health" in str_raises(ValueError, w.health, c, v)   # same tuple, other kind
    assert w.sample(c, v, 2) == 1 and w.sample(c, v) == 2        # other n, then back
    r = Readings()
    r.add(CH_FREE_HEAP, 1)
    r.add(CH_OUTBOX_DEPTH, 2)
    assert w.health(r.channels, r.values, r.n) == 3
    r.channels[1] = CH_FREE_HEAP                                 # same bytearray, now a duplicate
    assert "appears twice" in str_raises(ValueError, w.health, r.channels, r.values, r.n)
    assert w.seq == 4 and enc.count == 4                         # nothing written by the failures


def test_values_of_an_i32_array_are_trusted_and_of_any_other_type_checked():
    # An array whose type keeps every item an i32 int (array("i"), a board's values)
    # skips the per-record value checks once its channel tuple passed; an array of any
    # other type is checked every record like a list, cached tuple or not.
    enc = BatchEncoder(bytearray(1024), headroom=32)
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=1)
    c = (CH_TEMPERATURE, CH_HUMIDITY)
    good = array("i", [-(1 << 31), (1 << 31) - 1])
    assert w.sample(c, good) == 0 and w.sample(c, good) == 1
    assert list(good) == [-(1 << 31), (1 << 31) - 1]             # the type probe left it as it was
    pos = enc.end - READING_SIZE * 2
    assert struct.unpack_from("<BiBi", enc.buf, pos) == (CH_TEMPERATURE, -(1 << 31), CH_HUMIDITY, (1 << 31) - 1)
    for code, bad, exc, what in (("I", 1 << 31, ValueError, "i32"), ("q", 1 << 31, ValueError, "i32"),
                                 ("q", -(1 << 31) - 1, ValueError, "i32"), ("f", 21.5, TypeError, "fixed-point")):
        try:
            vals = array(code, [1, bad])
        except ValueError:
            print("SKIP array(%r): not in this build" % code)
            continue
        for _ in range(2):                                         # first check, then the cached tuple
            assert what in str_raises(exc, w.sample, c, vals), (code, bad)
        w2 = RecordWriter(enc, clock, boot=1)                      # the same array on the first check
        assert what in str_raises(exc, w2.sample, c, vals), (code, bad)
    small = array("h", [1, -2])                                   # not 4-byte ints: checked, written
    assert w.sample(c, small) == 2
    assert w.seq == 3 and enc.count == 3                           # nothing written by the failures


def test_machine_code_and_struct_write_the_same_bytes():
    # mqb_native.record (an array("i") with a cached channel tuple, on ports that run
    # machine code) against struct.pack_into (every other case, and ports that run none):
    # the same records, byte for byte, over random headers and readings, both kinds, the
    # i32 and u32 extremes, and a health record from a Readings list between samples
    # that share one values array (the cached tuple's channels must not be reused there).
    import mqb_record
    if mqb_record._P is None:
        assert not __import__("sys").implementation._mpy >> 10
        print("SKIP machine-code records: this port runs no machine code (struct.pack_into only)")
        return
    sample_sets = ((1,), (2, 1), (1, 2, 3), (1, 2, 3, 4), (6, 5, 4, 3, 2), (1, 2, 3, 4, 5, 6), ())
    x = 12345
    got = {}
    for path in ("native", "struct"):
        saved = mqb_record._P
        if path == "struct":
            mqb_record._P = None
        try:
            enc = BatchEncoder(bytearray(8192), headroom=32, max_count=1000, max_payload_bytes=8000)
            clock, ticks = _clock(s=0, ms=0)
            w = RecordWriter(enc, clock, boot=0xFFFFFFFF)
            vals = array("i", [0] * 8)
            r = Readings()
            y = x
            for i in range(120):
                y = (y * 1103515245 + 12345) & 0x7FFFFFFF
                chans = sample_sets[i % len(sample_sets)]
                for j in range(len(vals)):
                    y = (y * 1103515245 + 12345) & 0x7FFFFFFF
                    vals[j] = (-(1 << 31), (1 << 31) - 1, 0, -1)[j % 4] if i % 5 == 0 else (y << 1) - (1 << 31)
                ticks.t += y % 5000
                if i % 7 == 3:
                    clock.set((1 << 30) - 1 - i, 999, i % 2)
                if i == 60:
                    w.seq = (1 << 30) - 61           # the last seq of a boot is written
                if i % 3 == 1:
                    chans = bytes(chans)            # as the App passes them (a new object: checked again)
                if i % 13 == 7:                     # other channels, the same values array, after the
                    chans = list(reversed(chans)) if i % 2 else bytearray(reversed(chans))   # cached set
                if i % 11 == 5:                     # health from a Readings list, the same values array
                    r.clear()
                    for k in range(8):
                        r.add(0x80 + k, vals[k % 8])
                    w.health(r.channels, vals, 8)
                else:
                    w.sample(chans, vals, len(chans))
            got[path] = _subs(enc)
        finally:
            mqb_record._P = saved
    assert len(got["native"]) == 120
    for i, (a, b) in enumerate(zip(got["native"], got["struct"])):
        assert a == b, (i, a, b)


def test_machine_code_refuses_ranges_outside_its_buffers():
    # mqb_native's stores are not checked by the machine: each function checks its ranges
    # first and raises IndexError (struct.pack_into raised too), never writes past a buffer.
    import mqb_record
    if mqb_record._P is None:
        print("SKIP machine-code bounds: this port runs no machine code")
        return
    import mqb_native as N
    buf = bytearray(23)
    one = array("i", [7])
    N.record(buf, 0, 1, 2, 3, 4, 5, b"\x01", one, 1)              # exactly fits
    for args in ((buf, 1, 1, 2, 3, 4, 5, b"\x01", one, 1),      # one byte past the end
                 (buf, -1, 1, 2, 3, 4, 5, b"\x01", one, 1),
                 (bytearray(40), 0, 1, 2, 3, 4, 5, b"\x01", one, -1)):   # (n within chans and vals:
                                                                          # mqb_record's checks)
        before = bytes(args[0])
        str_raises(IndexError, N.record, *args)
        assert bytes(args[0]) == before
    t = bytes(512)
    out = bytearray(4)
    assert N.crc32(b"abc", 3, out, 0, 1, t, t) == 1
    for args in ((b"abc", 4, out, 0, 1, t, t), (b"abc", -1, out, 0, 1, t, t), (b"abc", 3, out, 1, 1, t, t),
                 (b"abc", 3, out, -1, 1, t, t)):
        str_raises(IndexError, N.crc32, *args)


def test_clock_advances_with_ticks_and_resyncs():
    clock, ticks = _clock(s=100, ms=0)
    ticks.t += 999
    clock.now()
    assert (clock.s, clock.ms) == (100, 999)
    ticks.t += 1
    clock.now()
    assert (clock.s, clock.ms) == (101, 0)
    ticks.t += 3600 * 1000 + 5
    clock.now()
    assert (clock.s, clock.ms) == (3701, 5)
    clock.set(50, 10, True)                        # a resync may move time back: it is the truth
    clock.now()
    assert (clock.s, clock.ms, clock.synced) == (50, 10, True)
    assert "outside 0..999" in str_raises(ValueError, clock.set, 1, 1000, True)
    assert "2054" in str_raises(ValueError, clock.set, 1 << 30, 0, True)


def test_clock_on_a_32bit_tick_source_wraps_and_stays_below_2_30():
    """Emulate a 32-bit port: ticks_ms wraps at 2**30, ticks_diff is signed 2**29.
    Over 3000 steps of up to 2**29-1 ms across many wraps, s/ms match an exact
    model and no value the clock computes reaches 2**30 (no bigint on 32-bit).
    The emulation itself stays below 2**30 too (tick, wrap count, and the model
    as s + ms), so it runs unchanged, allocation-free, on a 32-bit port."""
    PERIOD = 1 << 30         # a long int on 32-bit: only compared with, never computed with
    MASK = PERIOD - 1        # 2**30 - 1, the largest small int on 32-bit
    HALF = 1 << 29
    # the tick counter (starts just before a wrap), its wraps, the largest |delta| seen
    state = {"t": PERIOD - 1500, "wraps": 0, "max_d": 0}

    def ticks_ms():
        return state["t"]

    def ticks_diff(a, b):
        d = ((a - b + HALF) & MASK) - HALF
        if abs(d) > state["max_d"]:
            state["max_d"] = abs(d)
        return d

    def advance(step):                              # 0 <= step <= MASK; t + step is never formed
        t = state["t"]
        if step > MASK - t:                          # wraps: t + step - 2**30, kept below 2**30
            t = step - (MASK - t) - 1
            state["wraps"] += 1
        else:
            t += step
        state["t"] = t

    c = TickClock(ticks_ms, ticks_diff)
    s0, ms0 = 100000000, 123
    c.set(s0, ms0, True)
    want_s, want_ms = s0, ms0                       # exact model of the wall clock
    x = 12345
    for i in range(3000):
        x = (x * 1103515245 + 12345) & 0x3FFFFFFF   # 30-bit LCG: small ints on 32-bit too
        step = x % 1000 if i % 3 else x % HALF       # small steps and steps up to 2**29-1
        advance(step)
        want_ms += step % 1000
        want_s += step // 1000 + want_ms // 1000
        want_ms %= 1000
        c.now()
        assert (c.s, c.ms) == (want_s, want_ms), i
        assert 0 <= c.s < PERIOD and 0 <= c.ms < 1000 and 0 <= c._t < PERIOD
    wraps = state["wraps"]
    assert state["max_d"] < HALF and ms0 + state["max_d"] < PERIOD   # the largest sum now() forms
    assert wraps > 100, wraps
    print("CLOCK_32BIT_EMULATION steps 3000, tick wraps %d, largest delta %d ms, final s %d" % (wraps, state["max_d"], c.s))
    # a gap longer than half the tick period cannot be measured: counted as 0, time stays monotonic
    s, ms = c.s, c.ms
    advance(HALF + 10)
    c.now()
    assert (c.s, c.ms) == (s, ms)
    # and now() under heap_lock: nothing allocated
    micropython.heap_lock()
    try:
        for i in range(1000):
            advance(7)
            c.now()
    finally:
        micropython.heap_unlock()
    assert (c.s - s) * 1000 + (c.ms - ms) == 7000


def test_set_from_rtc_on_the_unix_port():
    assert port_epoch_to_2020() == EPOCH_2020_UNIX       # the Unix port counts from 1970
    c = TickClock()
    c.set_from_rtc(True)
    now = time.time_ns()
    c.now()
    got_ms = (c.s + EPOCH_2020_UNIX) * 1000 + c.ms
    assert abs(now // 1000000 - got_ms) < 2000, (now // 1000000, got_ms)
    assert c.synced is True


def _run_records(w, r, vals, n):
    """The steady-state loop: every 10th record a health record (Readings), the
    others samples (a board's CHANNELS + array("i")); reset the batch when full."""
    enc = w.enc
    for i in range(n):
        if i % 10 == 9:
            r.clear()
            r.add(CH_FREE_HEAP, 50000 + i)
            r.add(CH_OUTBOX_DEPTH, i & 7)
            r.add(CH_DROPPED_TOTAL, 0)
            r.add(CH_SAMPLED_TOTAL, i)
            seq = w.health(r.channels, r.values, r.n)
            if seq == FULL:
                enc.reset()
                seq = w.health(r.channels, r.values, r.n)
        else:
            vals[0] = 2000 + (i & 255)
            vals[1] = 4000 + (i & 511)
            vals[2] = 3300 - (i & 63)
            seq = w.sample(CHANNELS, vals)
            if seq == FULL:
                enc.reset()
                seq = w.sample(CHANNELS, vals)
        if seq < 0:
            raise AssertionError("record %d not written: %d" % (i, seq))


def test_10000_binary_records_allocate_nothing_gc_disabled():
    enc, w = _batch_writer()
    r = Readings()
    vals = array("i", [0, 0, 0])
    _run_records(w, r, vals, 10)             # warm up
    n = alloc_over(1, lambda i: _run_records(w, r, vals, 10000))
    print("RECORD_ALLOC_BYTES binary: %d bytes over 10000 records (9000 samples x 3 readings, 1000 health x 4)" % n)
    assert n == 0, n
    assert w.seq == 10010


def test_records_as_the_app_writes_them_are_checked_once_per_kind_and_allocate_nothing():
    # The App passes bytes(board.CHANNELS) and an array("i") for samples, a bytes constant
    # and another array("i") for health records, one health record now and then: each
    # kind's channel set and array are checked once, then every record skips the checks
    # (and, on a port that runs machine code, is packed by mqb_native.record).
    enc, w = _batch_writer()
    channels = bytes(CHANNELS)
    values = array("i", [2150, 4500, 3300])
    hch = bytes(range(0x80, 0x88))
    hvals = array("i", range(8))
    checks = [0]
    check = w._check

    def counting(*a):
        checks[0] += 1
        return check(*a)

    w._check = counting

    def run(k):
        i = 0
        while i < k:
            if enc.count == 100:
                enc.reset()
            if i % 10 == 9:
                w.health(hch, hvals)
            else:
                w.sample(channels, values)
            i += 1

    run(20)
    assert checks[0] == 2, checks                 # one per kind
    n = alloc_over(1, lambda i: run(10000))
    print("RECORD_ALLOC_BYTES as the App writes them: %d bytes over 10000 records (1 health in 10)" % n)
    assert n == 0, n
    assert checks[0] == 2, checks
    assert w.seq == 10020


def test_other_channels_with_the_remembered_values_array_are_written_as_given():
    # The machine-code path is for the remembered channel set only: the same values array
    # with other channels (same count, same kind) must not be packed with the remembered ones.
    enc = BatchEncoder(bytearray(512), headroom=32)
    clock, ticks = _clock()
    w = RecordWriter(enc, clock, boot=1)
    vals = array("i", [111, 222])
    w.sample((CH_TEMPERATURE, CH_HUMIDITY), vals)                # remembered: (1, 2) with vals
    w.sample(bytearray((CH_HUMIDITY, CH_TEMPERATURE)), vals)
    w.sample([CH_HUMIDITY, CH_TEMPERATURE], vals)
    w.sample((CH_HUMIDITY, CH_TEMPERATURE), vals)                # another tuple
    subs = _subs(enc)
    assert struct.unpack_from("<BiBi", subs[0], HEADER_SIZE) == (1, 111, 2, 222), subs[0]
    for rec in subs[1:]:
        assert struct.unpack_from("<BiBi", rec, HEADER_SIZE) == (2, 111, 1, 222), rec


def test_alternating_channel_sets_and_counts_allocate_nothing():
    # A kind keeps its first immutable channel set; other sets (two sensor tuples in turn)
    # and other reading counts are checked on every record, like lists, without allocating.
    enc, w = _batch_writer()
    a, b = (1, 2, 3), (4, 5)
    vals = array("i", [7, 8, 9])
    other = array("i", [1, 2, 3])

    def run(k):
        i = 0
        while i < k:
            if enc.count >= 96:
                enc.reset()
            w.sample(a, vals)
            w.sample(b, vals)
            w.sample(a, vals, 2)
            w.sample(a, other)
            i += 1

    run(5)
    n = alloc_over(1, lambda i: run(2500))
    print("RECORD_ALLOC_BYTES two channel sets, two counts, two arrays in turn: %d bytes over 10000 records" % n)
    assert n == 0, n


def test_10000_binary_records_under_heap_lock():
    enc, w = _batch_writer()
    r = Readings()
    vals = array("i", [0, 0, 0])
    _run_records(w, r, vals, 10)
    us = [0] * 5                                 # preallocated: nothing may allocate below
    micropython.heap_lock()
    try:
        for block in range(5):                   # 5 x 2000 = 10000 records
            t0 = time.ticks_us()
            _run_records(w, r, vals, 2000)
            us[block] = time.ticks_diff(time.ticks_us(), t0)
    finally:
        micropython.heap_unlock()
    assert w.seq == 10010
    us.sort()
    print("RECORD_TIME binary, per record (5 blocks of 2000, heap locked, Unix port on the host CPU, not a "
          "board figure): median %.1f us, min %.1f, max %.1f" % (us[2] / 2000, us[0] / 2000, us[4] / 2000))


def test_seq_limit_starts_a_new_boot_epoch():
    with TmpDir("rec") as d:
        bc = BootCounter(d + "/boot")
        boot = bc.next()
        enc = BatchEncoder(bytearray(512), headroom=32)
        clock, ticks = _clock()
        w = RecordWriter(enc, clock, boot, renew_boot=bc.next)
        c, v = _sample()
        w.seq = SEQ_LIMIT - 1
        assert w.sample(c, v) == SEQ_LIMIT - 1 and w.boot == boot
        assert w.sample(c, v) == 0 and w.boot == boot + 1 and bc.value == boot + 1
        recs = _subs(enc)
        assert struct.unpack_from("<II", recs[0], 4) == (boot, SEQ_LIMIT - 1)
        assert struct.unpack_from("<II", recs[1], 4) == (boot + 1, 0)
        w2 = RecordWriter(enc, clock, 9)
        w2.seq = SEQ_LIMIT
        assert "renew_boot" in str_raises(RuntimeError, w2.sample, c, v)


def test_json_records_and_their_cost():
    enc = BatchEncoder(bytearray(2048), headroom=32)
    clock, ticks = _clock(s=123456789, ms=123, synced=True)
    w = RecordWriter(enc, clock, boot=3, record_format=FORMAT_JSON)
    assert w.sample((CH_TEMPERATURE, CH_SUPPLY_VOLTAGE), [2150, 3300]) == 0
    r = _health(Readings())
    assert w.health(r.channels, r.values, r.n) == 1
    text = _subs(enc)
    assert text[0] == (b'{"v":1,"kind":"sample","boot":3,"seq":0,"ts_ms":%d,"synced":true,'
                       b'"r":{"temperature":2150,"supply_voltage":3300}}' % ((123456789 + EPOCH_2020_UNIX) * 1000 + 123))
    h = json.loads(text[1])
    assert h["kind"] == "health" and h["seq"] == 1 and h["r"]["last_error"] == -113
    assert sorted(h["r"]) == sorted(["free_heap", "outbox_depth", "dropped_total", "reconnects", "last_error",
                                     "sampled_total", "outbox_bytes"])
    small = BatchEncoder(bytearray(32 + 250), headroom=32)   # one ~130-byte JSON sample, not two
    wj = RecordWriter(small, clock, boot=3, record_format=FORMAT_JSON)
    c, v = _sample()
    assert wj.sample(c, v) == 0 and wj.sample(c, v) == FULL and wj.seq == 1
    big = BatchEncoder(bytearray(65536 + 64), headroom=64, max_payload_bytes=65536, max_count=100)
    wj = RecordWriter(big, clock, boot=3, record_format=FORMAT_JSON)

    def one(i):
        if wj.sample(c, v) == FULL:
            raise AssertionError("batch full")
    n = alloc_over(50, one)
    print("RECORD_ALLOC_BYTES json: %d bytes per sample record with 3 readings (mean of 50: total %d)"
          % (n // 50, n))
    assert n > 0   # JSON allocates: the documented cost
