"""Host parser of the telemetry record format (docs/records.md): layout, reason codes, check order."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbatch.wire import records as R

T = 1_795_000_000_123  # ms since the Unix epoch (2026-11-18)


@pytest.mark.fast
def test_binary_sample_layout_matches_docs():
    data = R.encode_binary("sample", 3, 17, T, [(1, 2150), (2, 4500), (3, 3300)])
    assert len(data) == 33  # "a sample with 3 readings: 33 bytes"
    assert data[:4] == bytes([1, 1, 1, 3])  # version, kind, flags (synced), n
    assert struct.unpack_from("<IIIH", data, 4) == (3, 17, (T // 1000) - 1_577_836_800, 123)
    assert data[18:23] == bytes([1]) + struct.pack("<i", 2150)
    rec = R.parse(data)
    assert rec == R.Record("binary", "sample", True, 3, 17, T, ((1, 2150), (2, 4500), (3, 3300)))


@pytest.mark.fast
def test_json_example_of_docs_parses():
    doc = (
        b'{"v":1,"kind":"sample","boot":3,"seq":17,"ts_ms":1795000000123,"synced":true,'
        b'"r":{"temperature":2150,"supply_voltage":3300}}'
    )
    assert R.parse(doc) == R.Record("json", "sample", True, 3, 17, T, ((1, 2150), (3, 3300)))


def test_health_record_and_dropped_total():
    rec = R.parse(R.encode_binary("health", 1, 9, T, [(0x80, 51200), (0x82, 7), (0x84, -113)], synced=False))
    assert (rec.kind, rec.synced, rec.value(R.DROPPED_TOTAL), rec.value(0x84)) == ("health", False, 7, -113)


@pytest.mark.fast
@pytest.mark.parametrize("fmt", [R.encode_binary, R.encode_json])
def test_encoders_round_trip(fmt):
    readings = [(1, -5000), (2, 10000), (3, 0), (4, -127), (5, 120000), (6, 200000)]
    rec = R.parse(fmt("sample", 2**32 - 1, 2**32 - 1, T, readings), received_at_ms=T)
    assert (rec.boot, rec.seq, rec.time_ms, rec.readings) == (2**32 - 1, 2**32 - 1, T, tuple(readings))


def _bin(kind=1, flags=1, n=None, readings=(), time_ms=0, extra=b""):
    body = b"".join(struct.pack("<Bi", c, v) for c, v in readings)
    n = len(readings) if n is None else n
    return struct.pack("<BBBBIIIH", 1, kind, flags, n, 1, 2, 200_000_000, time_ms) + body + extra


BAD = [
    ("empty", b"", R.UNKNOWN_VERSION, "empty sub-payload"),
    ("version_2", b"\x02" + _bin()[1:], R.UNKNOWN_VERSION, "0x02"),
    ("json_v2", b'{"v":2,"kind":"sample"}', R.UNKNOWN_VERSION, "version 2"),
    ("short_header", _bin()[:17], R.MALFORMED, "shorter than its 18-byte header"),
    ("bad_kind", _bin(kind=3), R.MALFORMED, "kind 3"),
    ("reserved_flags", _bin(flags=3), R.MALFORMED, "reserved bits"),
    ("too_many_readings", _bin(n=33), R.MALFORMED, "33 readings exceed"),
    ("truncated_reading", _bin(readings=[(1, 1)])[:-1], R.MALFORMED, "need 23 bytes, record has 22"),
    ("trailing_bytes", _bin(readings=[(1, 1)], extra=b"\0"), R.MALFORMED, "record has 24"),
    ("time_ms_1000", _bin(time_ms=1000), R.MALFORMED, "time_ms 1000"),
    ("json_syntax", b'{"v":1,', R.MALFORMED, "does not parse"),
    ("json_not_utf8", b'{"v":1,"\xff":1}', R.MALFORMED, "not UTF-8"),
    ("json_missing", b'{"v":1,"kind":"sample"}', R.MALFORMED, "lacks boot, seq, ts_ms, synced, r"),
    (
        "json_r_array",
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":1,"synced":true,"r":[["temperature",1]]}',
        R.MALFORMED,
        "'r' must be an object",
    ),
    (
        "json_bool_seq",
        b'{"v":1,"kind":"sample","boot":1,"seq":true,"ts_ms":1,"synced":true,"r":{}}',
        R.MALFORMED,
        "'seq' must be an integer",
    ),
    (
        "json_float_value",
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":1,"synced":true,"r":{"light":1.5}}',
        R.MALFORMED,
        "32-bit integer",
    ),
    ("json_dup_key", b'{"v":1,"v":1}', R.MALFORMED, "a key more than once"),
    ("unknown_channel", _bin(readings=[(9, 1)]), R.UNKNOWN_CHANNEL, "0x09"),
    (
        "json_unknown_channel",
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":1,"synced":true,"r":{"wind":1}}',
        R.UNKNOWN_CHANNEL,
        "'wind'",
    ),
    ("health_channel_in_sample", _bin(readings=[(0x82, 1)]), R.KIND_MISMATCH, "dropped_total belongs in health"),
    ("duplicate_channel", _bin(readings=[(1, 1), (1, 2)]), R.DUPLICATE_CHANNEL, "temperature appears more than once"),
    (
        "json_duplicate_channel",
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":1,"synced":true,"r":{"light":1,"light":2}}',
        R.DUPLICATE_CHANNEL,
        "light",
    ),
    ("temperature_high", _bin(readings=[(1, 15001)]), R.OUT_OF_RANGE, "temperature = 15001 is outside -5000..15000"),
    ("rssi_positive", _bin(readings=[(4, 1)]), R.OUT_OF_RANGE, "rssi = 1"),
    ("pressure_low", _bin(readings=[(5, 29999)]), R.OUT_OF_RANGE, "pressure"),
    ("negative_heap", _bin(kind=2, readings=[(0x80, -1)]), R.OUT_OF_RANGE, "free_heap = -1 is outside 0.."),
]


@pytest.mark.fast
@pytest.mark.parametrize("data,reason,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_records_get_their_reason_and_a_detail(data, reason, words):
    with pytest.raises(R.RecordError) as e:
        R.parse(data)
    assert e.value.reason == reason and words in e.value.detail


def test_check_order_channel_before_range():
    # an unknown channel after an out-of-range reading still reports the channel problem first
    with pytest.raises(R.RecordError) as e:
        R.parse(_bin(readings=[(1, 99999), (9, 1)]))
    assert e.value.reason == R.UNKNOWN_CHANNEL


def test_time_in_future_is_relative_to_received_at():
    data = R.encode_binary("sample", 1, 1, T, [(1, 2000)])
    R.parse(data, received_at_ms=T - 86_400_000)  # exactly one day ahead: accepted
    with pytest.raises(R.RecordError) as e:
        R.parse(data, received_at_ms=T - 86_400_001)
    assert e.value.reason == R.TIME_IN_FUTURE and "86400001 ms after received_at" in e.value.detail
    with pytest.raises(R.RecordError):
        R.parse(data, received_at_ms=T - 61_000, max_future_ms=60_000)


@pytest.mark.parametrize("topic,device", [("mqbatch/dev-1/telemetry", "dev-1"), ("mqbatch/a.b_c/telemetry", "a.b_c")])
def test_device_from_topic(topic, device):
    assert R.device_from_topic(topic) == device


@pytest.mark.parametrize(
    "topic", ["mqbatch/dev-1/status", "mqbatch//telemetry", "x/mqbatch/d/telemetry", "mqbatch/a/b/telemetry", "", None]
)
def test_other_topics_are_rejected_with_a_reason(topic):
    with pytest.raises(R.RecordError) as e:
        R.device_from_topic(topic)
    assert e.value.reason == R.TOPIC_INVALID


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_hostile_bytes_only_ever_raise_record_error(data):
    for candidate in (data, b"\x01" + data, b"{" + data):
        try:
            rec = R.parse(candidate, received_at_ms=T)
        except R.RecordError as e:
            assert e.reason in R.RECORD_REASONS and e.detail
        else:
            assert rec.kind in (R.SAMPLE, R.HEALTH)
