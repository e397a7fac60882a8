# mqb_record: telemetry records (docs/records.md) written straight into a BatchEncoder.
#
# Binary record v1 (the default) is serialised in place with enc.reserve(n) and
# mqb_native.record (machine code, for an array("i") of values and a remembered channel
# set) or struct.pack_into: once the objects exist, writing a record allocates nothing
# (tests/mpy/mp_test_record.py measures it with the GC disabled and runs it under
# micropython.heap_lock()). The JSON record option builds a str per record: it
# allocates, which is the documented cost of choosing JSON.
#
# Small integers. On 32-bit ports an int is a heap-free "small int" only while it
# is in -2**30 .. 2**30-1; anything larger is a heap-allocated bigint. Every value
# touched per record stays below 2**30 by design:
#   - seq < SEQ_LIMIT = 2**30 (at the limit the writer starts a new boot epoch,
#     see RecordWriter.renew_boot);
#   - time is kept as s (seconds since 2020-01-01, < 2**30 until 2054) + ms
#     (0..999) and advanced with ticks_ms()/ticks_diff() deltas (|delta| < 2**29
#     on 32-bit ports), never as ms or ns since an epoch;
#   - readings are i32 fixed point; ranges of docs/records.md are far below 2**30.
# time.time_ns() (a bigint) is read only in TickClock.set_from_rtc(), at boot and
# after a clock sync, never per record.
import struct
import time
from array import array
from mqb_codec import FULL

_P = None                                         # struct.pack_into (the WebAssembly port)
if __import__("sys").implementation._mpy >> 10:   # the port runs machine code
    try:
        from mqb_native import record as _P       # a record packed in place, ~9x faster
    except (ImportError, ValueError, MemoryError):   # not deployed, a .mpy of another arch or
        pass                                      # version: struct.pack_into (mqb_app logs it)
    if _P is not None:                            # checked once against a known record
        _b = bytearray(29)
        _P(_b, 1, 0x0102, 0x81020304, 5, 6, 7, b"\x03\x01", array("i", [-2, 0x12345678]), 2)
        if _b != (b"\x00\x01\x02\x01\x02\x04\x03\x02\x81\x05\x00\x00\x00\x06\x00\x00\x00\x07\x00"
                  b"\x03\xfe\xff\xff\xff\x01\x78\x56\x34\x12"):
            _P = None
            print("mqb: records: mqb_native's machine code failed its check on this port: struct.pack_into")
        del _b

_VERSION = const(1)
_KIND_SAMPLE = const(1)
_KIND_HEALTH = const(2)
_FLAG_SYNCED = const(0x01)
_MAX_READINGS = const(32)
HEADER_SIZE = 18
READING_SIZE = 5
_SEQ_LIMIT = const(1 << 30)    # seq stays a small int on every port
_SEQ_MAX = const(0x3FFFFFFF)   # _SEQ_LIMIT - 1 (a small int on 32-bit ports too)
_TIME_S_LIMIT = const(1 << 30)  # 2054-01-10: time_s stays a small int on every port

_EPOCH_2020_UNIX = const(1577836800)   # 2020-01-01T00:00:00Z in seconds since 1970-01-01
_EPOCH_2020_2000 = const(631152000)    # ... since 2000-01-01 (embedded ports' epoch)

_FORMAT_BINARY = const("binary")
_FORMAT_JSON = const("json")

# Channels (docs/records.md). Sample records carry 1..6, health records 0x80..0x87
# (private: a public name costs an interned string and a dict entry on a board).
_CH_TEMPERATURE = const(1)      # centi-degC
_CH_HUMIDITY = const(2)         # centi-%
_CH_SUPPLY_VOLTAGE = const(3)   # mV
_CH_RSSI = const(4)             # dBm
_CH_PRESSURE = const(5)         # Pa
_CH_LIGHT = const(6)            # lux
_CH_FREE_HEAP = const(0x80)     # bytes
_CH_OUTBOX_DEPTH = const(0x81)  # entries
_CH_DROPPED_TOTAL = const(0x82)  # records (Outbox.dropped_total)
_CH_RECONNECTS = const(0x83)    # count since boot
_CH_LAST_ERROR = const(0x84)    # MQTT reason code or negative errno, 0 = none
_CH_SAMPLED_TOTAL = const(0x85)  # records sampled since boot
_CH_OUTBOX_BYTES = const(0x86)  # bytes
_CH_RELEASED = const(0x87)      # records released unconfirmed since boot (mqb_e2e.E2E.released_report)

_SAMPLE_NAMES = ("temperature", "humidity", "supply_voltage", "rssi", "pressure", "light")
_HEALTH_NAMES = ("free_heap", "outbox_depth", "dropped_total", "reconnects", "last_error",
                 "sampled_total", "outbox_bytes", "released_unconfirmed")

_I32_MIN = const(-2147483648)
_I32_MAX = const(2147483647)


def port_epoch_to_2020():
    """Seconds from this port's time epoch (1970 or 2000) to 2020-01-01."""
    return _EPOCH_2020_UNIX if time.gmtime(0)[0] == 1970 else _EPOCH_2020_2000


class TickClock:
    """Wall-clock time for records as (s since 2020-01-01, ms), advanced by ticks.

    The board sets it from its RTC (set_from_rtc) at boot and after every clock
    sync (NTP on boards; on the Unix port the host clock counts as synced), or
    from any source with set(). now() advances s/ms by the ticks elapsed since
    the previous call, without allocating. Read s, ms and synced after now().

    On 32-bit ports ticks_ms() wraps every 2**30 ms and ticks_diff() is only
    meaningful for less than 2**29 ms (6.2 days): call now() at least that often
    (every record and health record does). If more time passed, now() cannot
    tell how much and counts 0 ms for the gap (time stays monotonic).
    ticks_ms/ticks_diff may be injected (tests emulate a 32-bit port's wrap).
    """

    def __init__(self, ticks_ms=None, ticks_diff=None):
        self._ticks_ms = ticks_ms or time.ticks_ms
        self._ticks_diff = ticks_diff or time.ticks_diff
        self.s = 0
        self.ms = 0
        self.synced = False
        self._t = self._ticks_ms()

    def set(self, s, ms, synced):
        """Anchor the clock: s seconds since 2020-01-01 and ms (0..999), now."""
        if not 0 <= s < _TIME_S_LIMIT:
            raise ValueError("time_s %d outside 0..%d (2020-01-01..2054-01-10)" % (s, _TIME_S_LIMIT - 1))
        if not 0 <= ms < 1000:
            raise ValueError("time_ms %d outside 0..999" % ms)
        self._t = self._ticks_ms()
        self.s = s
        self.ms = ms
        self.synced = bool(synced)

    def set_from_rtc(self, synced):
        """Anchor to the port's RTC (time.time_ns(), or time.time() where it is
        missing). Allocates (bigint arithmetic): call at boot and after a sync,
        not per record. An RTC before 2020 (never set) anchors at
        2020-01-01T00:00:00 and must not be flagged synced."""
        off = port_epoch_to_2020()
        if hasattr(time, "time_ns"):
            ns = time.time_ns()
            s = ns // 1000000000 - off
            ms = ns // 1000000 % 1000
        else:
            s = time.time() - off
            ms = 0
        if s < 0:
            if synced:
                raise ValueError("RTC reads %d s before 2020-01-01 but was declared synced" % -s)
            s, ms = 0, 0
        self.set(s, ms, synced)

    def now(self):
        """Advance s/ms to the current tick. No allocation; all values < 2**30."""
        t = self._ticks_ms()
        d = self._ticks_diff(t, self._t)
        if d < 0:
            d = 0  # a gap longer than half the tick period: unknown, count 0
        total = self.ms + d
        if total >= 1000:
            q = total // 1000
            self.s += q
            total -= q * 1000
        self.ms = total
        self._t = t


class Readings:
    """Caller-owned, reusable set of up to `capacity` (channel, value) readings,
    for records whose channels vary (health): clear(), add() per reading, then
    writer.health(r.channels, r.values, r.n). Values are fixed-point ints in
    the unit of their channel (no floats)."""

    def __init__(self, capacity=_MAX_READINGS):
        if not 0 < capacity <= _MAX_READINGS:
            raise ValueError("capacity must be 1..%d readings, got %d" % (_MAX_READINGS, capacity))
        self.channels = bytearray(capacity)
        self.values = [0] * capacity
        self.n = 0

    def clear(self):
        self.n = 0

    def add(self, channel, value):
        """Append one reading (value checks happen when the record is written)."""
        if self.n >= len(self.channels):
            raise ValueError("Readings holds at most %d readings" % len(self.channels))
        if not 0 <= channel <= 255:
            raise ValueError("channel %d is not a u8" % channel)
        self.channels[self.n] = channel
        self.values[self.n] = value
        self.n += 1


class RecordWriter:
    """Writes sample and health records into a BatchEncoder (docs/records.md).

    enc: mqb_codec.BatchEncoder the records go into.
    clock: TickClock (or an object with now() and attributes s, ms, synced).
    boot: this boot's number (mqb_boot.BootCounter(...).next()).
    record_format: "binary" (default, allocation-free) or "json".
    renew_boot: callable returning a new boot number (BootCounter.next), used
        when seq reaches 2**30; without it the writer raises there.

    sample(channels, values, n=-1) / health(channels, values, n=-1) write one
    record of n readings (n = len(channels) when -1): channels[i] (ints, e.g.
    the board's CHANNELS tuple or Readings.channels) with values[i] (fixed-point
    ints, e.g. the array("i") the board's sample() fills). They return the
    record's seq (>= 0), or FULL (-1) when the batch cannot take it: nothing was
    written and no seq was used; publish the batch, enc.reset(), call again.
    Bad readings raise ValueError/TypeError before anything is written.
    seq counts per boot from 0, shared by samples and health records.
    """

    def __init__(self, enc, clock, boot, record_format=_FORMAT_BINARY, renew_boot=None):
        if record_format not in (_FORMAT_BINARY, _FORMAT_JSON):
            raise ValueError("record_format must be %r or %r, got %r" % (_FORMAT_BINARY, _FORMAT_JSON, record_format))
        if not 0 <= boot <= 0xFFFFFFFF:
            raise ValueError("boot %d is not a u32" % boot)
        self.enc = enc
        self.clock = clock
        self.boot = boot
        self.seq = 0
        self.json = record_format == _FORMAT_JSON
        self.renew_boot = renew_boot
        # per kind (sample, health; None until then), the first immutable channel set (a
        # tuple or bytes: a board's CHANNELS) that passed _check: (the set, n << 8 | kind,
        # the array("i") of values or None, the channels as bytes). The same set, n and
        # kind skip the channel checks; that same array skips the value checks too and is
        # packed in machine code (mqb_native.record). Kept once made: other sets and other
        # n are checked on every record, as lists are, and allocate nothing. One attribute
        # (7 in all: the smallest instance dict).
        self._ok = [None, None]

    def sample(self, channels, values, n=-1, _kind=_KIND_SAMPLE):
        """Write a sample record (channels 1..6). (_kind: health()'s, so that a sample is
        one Python call.)"""
        kind = _kind
        if n < 0:
            n = len(channels)
        ok = self._ok[kind - 1]
        hit = ok is not None and channels is ok[0] and n << 8 | kind == ok[1]
        if not hit or n > len(values):
            hit = self._check(kind, channels, values, n)   # the channel set, and sizes
            ok = self._ok[kind - 1]
        if not hit or values is not ok[2]:
            for i in range(n):                    # the values, every record (unless cached array("i"))
                v = values[i]
                if type(v) is not int or not _I32_MIN <= v <= _I32_MAX:
                    self._bad_value(channels[i], v)
        seq = self.seq
        if seq > _SEQ_MAX:
            seq = self._next_seq()
        if self.json:
            return self._write_json(kind, channels, values, n, seq)
        enc = self.enc
        pos = enc.reserve(HEADER_SIZE + READING_SIZE * n)
        if pos == FULL:
            return FULL
        clock = self.clock
        clock.now()
        buf = enc.buf
        if hit and values is ok[2] and _P is not None:
            _P(buf, pos, kind | (_FLAG_SYNCED << 8 if clock.synced else 0), self.boot, seq, clock.s, clock.ms,
               ok[3], values, n)                  # array("i"), the cached set: machine code
        else:
            struct.pack_into("<BBBBIIIH", buf, pos, _VERSION, kind, _FLAG_SYNCED if clock.synced else 0, n,
                             self.boot, seq, clock.s, clock.ms)
            pos += HEADER_SIZE
            for i in range(n):
                struct.pack_into("<Bi", buf, pos, channels[i], values[i])
                pos += READING_SIZE
        self.seq = seq + 1
        return seq

    def health(self, channels, values, n=-1):
        """Write a health record (channels 0x80..0x87)."""
        return self.sample(channels, values, n, _KIND_HEALTH)

    def _check(self, kind, chans, vals, n):
        """Raise unless chans[:n] is a valid channel set for kind and vals holds n
        readings. A tuple or bytes of channels (a board's CHANNELS; the App's bytes of
        them) is immutable: the first one of a kind to pass is remembered, and sample()
        then checks only the values for the same (set, n, kind), and not those either
        when they are in the same array("i"). True if this call remembered chans."""
        if not 0 <= n <= _MAX_READINGS or n > len(chans) or n > len(vals):
            raise ValueError("record of %d readings: 0..%d allowed, and channels (%d) and values (%d) must "
                             "hold them" % (n, _MAX_READINGS, len(chans), len(vals)))
        lo = 1 if kind == _KIND_SAMPLE else 0x80
        hi = lo + (len(_SAMPLE_NAMES) if kind == _KIND_SAMPLE else len(_HEALTH_NAMES))
        seen = 0
        for i in range(n):
            c = chans[i]
            if not lo <= c < hi:
                raise ValueError("channel 0x%02x not allowed in a %s record (0x%02x..0x%02x)"
                                 % (c, "sample" if kind == _KIND_SAMPLE else "health", lo, hi - 1))
            bit = 1 << (c - lo)
            if seen & bit:
                raise ValueError("channel 0x%02x appears twice in one record" % c)
            seen |= bit
        if (type(chans) is tuple or type(chans) is bytes) and self._ok[kind - 1] is None:
            # vals skips the value checks if it is an array of 4-byte signed ints (array("i"),
            # or "l" on 32-bit ports): every item an i32 by its type. Probed once here
            # (restored): 2**31 stored there reads back as -2**31. Allocates on 32-bit ports.
            trusted = None
            if type(vals) is array and len(vals):
                v = vals[0]
                try:
                    vals[0] = 0x80000000
                    if vals[0] == -0x80000000:
                        trusted = vals
                except (OverflowError, TypeError, ValueError):
                    pass
                finally:
                    vals[0] = v
            self._ok[kind - 1] = (chans, n << 8 | kind, trusted, chans if type(chans) is bytes else bytes(chans[:n]))
            return True
        return False

    def _bad_value(self, c, v):
        if type(v) is not int:
            raise TypeError("reading for channel 0x%02x must be a fixed-point int, got %s"
                            % (c, type(v).__name__))
        raise ValueError("reading %d for channel 0x%02x does not fit in i32" % (v, c))

    def _next_seq(self):
        if self.seq >= _SEQ_LIMIT:
            if self.renew_boot is None:
                raise RuntimeError("seq reached %d in boot %d: pass renew_boot to start a new boot epoch"
                                   % (_SEQ_LIMIT, self.boot))
            self.boot = self.renew_boot()
            self.seq = 0
        return self.seq

    def _write_json(self, kind, chans, vals, n, seq):
        # Allocates: the str, its parts and the encoded bytes (the cost of JSON).
        clock = self.clock
        clock.now()
        if kind == _KIND_SAMPLE:
            names, base, kname = _SAMPLE_NAMES, 1, "sample"
        else:
            names, base, kname = _HEALTH_NAMES, 0x80, "health"
        parts = []
        for i in range(n):
            parts.append('"%s":%d' % (names[chans[i] - base], vals[i]))
        text = '{"v":1,"kind":"%s","boot":%d,"seq":%d,"ts_ms":%d,"synced":%s,"r":{%s}}' % (
            kname, self.boot, seq, (clock.s + _EPOCH_2020_UNIX) * 1000 + clock.ms,
            "true" if clock.synced else "false", ",".join(parts))
        if not self.enc.add(text.encode()):
            return FULL
        self.seq = seq + 1
        return seq
