"""Host parser of the telemetry record format v1 (docs/records.md).

A sub-payload of a batch is one telemetry record: binary v1 (first byte 0x01)
or JSON v1 (first byte `{`). `parse()` checks its structure and content and
returns a `Record`, or raises `RecordError` whose `reason` is one of
`RECORD_REASONS` and whose `detail` says what is wrong. Pure functions, no
I/O; the Spark job calls them inside its Arrow batches, so host and Spark give
the same answer.

Checks run in this order; the first failing one wins:
version (UNKNOWN_RECORD_VERSION) -> structure (RECORD_MALFORMED) ->
channels (RECORD_UNKNOWN_CHANNEL, RECORD_CHANNEL_KIND_MISMATCH,
RECORD_DUPLICATE_CHANNEL, in reading order) -> ranges
(RECORD_VALUE_OUT_OF_RANGE) -> time (RECORD_TIME_IN_FUTURE).
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct

from mqbatch.wire.device_id import DEVICE_ID_PATTERN, device_id_problem

BINARY_V1 = 0x01
JSON_START = 0x7B  # "{"

EPOCH_2020_S = 1_577_836_800  # time_s counts from 2020-01-01T00:00:00Z
MAX_READINGS = 32
HEADER = struct.Struct("<BBBBIIIH")  # version, kind, flags, n, boot, seq, time_s, time_ms
READING = struct.Struct("<Bi")  # channel, value
U32_MAX = 0xFFFF_FFFF
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
MAX_FUTURE_MS = 86_400_000  # device time more than 1 day after received_at
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the last time a Spark timestamp holds

SAMPLE, HEALTH = "sample", "health"
KINDS = {1: SAMPLE, 2: HEALTH}
KIND_CODES = {v: k for k, v in KINDS.items()}

# content reason codes (after the batch passed structural validation)
UNKNOWN_VERSION = "UNKNOWN_RECORD_VERSION"
MALFORMED = "RECORD_MALFORMED"
UNKNOWN_CHANNEL = "RECORD_UNKNOWN_CHANNEL"
KIND_MISMATCH = "RECORD_CHANNEL_KIND_MISMATCH"
DUPLICATE_CHANNEL = "RECORD_DUPLICATE_CHANNEL"
OUT_OF_RANGE = "RECORD_VALUE_OUT_OF_RANGE"
TIME_IN_FUTURE = "RECORD_TIME_IN_FUTURE"
RECORD_REASONS = (
    UNKNOWN_VERSION,
    MALFORMED,
    UNKNOWN_CHANNEL,
    KIND_MISMATCH,
    DUPLICATE_CHANNEL,
    OUT_OF_RANGE,
    TIME_IN_FUTURE,
)
# landed-PUBLISH level: the topic is not mqbatch/<device>/telemetry, or its device id is not allowed
TOPIC_INVALID = "TOPIC_NOT_TELEMETRY"
DEVICE_ID_INVALID = "TOPIC_DEVICE_ID_INVALID"

TOPIC_RE = re.compile(r"mqbatch/([^/]+)/telemetry")
# A device id is its broker username and the second topic level (docs/records.md): the one
# rule of mqbatch.wire.device_id, which `fleet add` uses too (1..64 of a-z 0-9 _ . -, first a
# letter or digit: no `.`, `..`, hidden name or upper case)
DEVICE_ID_RE = re.compile(DEVICE_ID_PATTERN)


@dataclasses.dataclass(frozen=True)
class Channel:
    id: int
    name: str
    kind: str
    low: int | None  # inclusive bounds, None = unbounded
    high: int | None
    divisor: int  # value / divisor = value in the natural unit (degC, %, V, ...)


CHANNELS = {
    c.id: c
    for c in (
        Channel(1, "temperature", SAMPLE, -5000, 15000, 100),
        Channel(2, "humidity", SAMPLE, 0, 10000, 100),
        Channel(3, "supply_voltage", SAMPLE, 0, 20000, 1000),
        Channel(4, "rssi", SAMPLE, -127, 0, 1),
        Channel(5, "pressure", SAMPLE, 30000, 120000, 1),
        Channel(6, "light", SAMPLE, 0, 200000, 1),
        Channel(0x80, "free_heap", HEALTH, 0, None, 1),
        Channel(0x81, "outbox_depth", HEALTH, 0, None, 1),
        Channel(0x82, "dropped_total", HEALTH, 0, None, 1),
        Channel(0x83, "reconnects", HEALTH, 0, None, 1),
        Channel(0x84, "last_error", HEALTH, None, None, 1),
        Channel(0x85, "sampled_total", HEALTH, 0, None, 1),
        Channel(0x86, "outbox_bytes", HEALTH, 0, None, 1),
        Channel(0x87, "released_unconfirmed", HEALTH, 0, None, 1),
    )
}
CHANNEL_BY_NAME = {c.name: c for c in CHANNELS.values()}
DROPPED_TOTAL = 0x82


class RecordError(ValueError):
    """A sub-payload that is not a valid telemetry record; `reason` is a code of RECORD_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Record:
    format: str  # "binary" | "json"
    kind: str  # "sample" | "health"
    synced: bool
    boot: int
    seq: int
    time_ms: int  # device time, ms since the Unix epoch (UTC)
    readings: tuple[tuple[int, int], ...]  # (channel id, raw value), in record order

    def value(self, channel: int) -> int | None:
        return next((v for c, v in self.readings if c == channel), None)


def device_from_topic(topic: str | None) -> str:
    """The device id of a `mqbatch/<device>/telemetry` topic, else RecordError
    (TOPIC_NOT_TELEMETRY, or TOPIC_DEVICE_ID_INVALID for an id outside DEVICE_ID_RE)."""
    m = TOPIC_RE.fullmatch(topic or "")
    if not m:
        raise RecordError(TOPIC_INVALID, f"topic {ascii(str(topic)[:80])} is not mqbatch/<device>/telemetry")
    device = m.group(1)
    problem = device_id_problem(device)
    if problem is not None:
        raise RecordError(DEVICE_ID_INVALID, problem)
    return device


def parse(data: bytes, received_at_ms: int | None = None, max_future_ms: int = MAX_FUTURE_MS) -> Record:
    """Parse and validate one sub-payload. `received_at_ms` (ms since the Unix epoch)
    enables the time-in-future check. Raises RecordError, never anything else on hostile input."""
    data = bytes(data)
    if not data:
        raise RecordError(UNKNOWN_VERSION, "empty sub-payload (no version byte)")
    if data[0] == BINARY_V1:
        rec = _parse_binary(data)
    elif data[0] == JSON_START:
        rec = _parse_json(data)
    else:
        raise RecordError(UNKNOWN_VERSION, f"first byte 0x{data[0]:02x} is neither 0x01 (binary v1) nor '{{' (JSON)")
    _check_content(rec)
    if received_at_ms is not None and rec.time_ms - received_at_ms > max_future_ms:
        raise RecordError(
            TIME_IN_FUTURE,
            f"device time {rec.time_ms} ms is {rec.time_ms - received_at_ms} ms "
            f"after received_at (limit {max_future_ms} ms)",
        )
    return rec


def _parse_binary(data: bytes) -> Record:
    if len(data) < HEADER.size:
        raise RecordError(
            MALFORMED, f"binary record of {len(data)} bytes is shorter than its {HEADER.size}-byte header"
        )
    _, kind, flags, n, boot, seq, time_s, time_ms = HEADER.unpack_from(data)
    if kind not in KINDS:
        raise RecordError(MALFORMED, f"kind {kind} is neither 1 (sample) nor 2 (health)")
    if flags & 0xFE:
        raise RecordError(MALFORMED, f"flags 0x{flags:02x} has reserved bits 1-7 set")
    if n > MAX_READINGS:
        raise RecordError(MALFORMED, f"{n} readings exceed the maximum of {MAX_READINGS}")
    if len(data) != HEADER.size + READING.size * n:
        raise RecordError(
            MALFORMED, f"{n} readings need {HEADER.size + READING.size * n} bytes, record has {len(data)}"
        )
    if time_ms > 999:
        raise RecordError(MALFORMED, f"time_ms {time_ms} is not in 0..999")
    readings = tuple(READING.unpack_from(data, HEADER.size + READING.size * i) for i in range(n))
    return Record("binary", KINDS[kind], bool(flags & 1), boot, seq, (EPOCH_2020_S + time_s) * 1000 + time_ms, readings)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Pairs(list):
    """A JSON object as the list of its (key, value) pairs, duplicates kept."""


def _parse_json(data: bytes) -> Record:
    try:
        obj = json.loads(data.decode("utf-8"), object_pairs_hook=_Pairs)
    except UnicodeDecodeError as e:
        raise RecordError(MALFORMED, f"JSON record is not UTF-8: {e}") from None
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, or an int over Python's digit limit
        raise RecordError(MALFORMED, f"JSON record does not parse: {str(e)[:200]}") from None
    if not isinstance(obj, _Pairs):
        raise RecordError(MALFORMED, "JSON record is not an object")
    top = dict(obj)
    if len(top) != len(obj):
        raise RecordError(MALFORMED, "JSON record has a key more than once")
    v = top.get("v")
    if not _is_int(v):
        raise RecordError(MALFORMED, f"JSON record 'v' must be an integer, got {v!r:.40}")
    if v != 1:
        raise RecordError(UNKNOWN_VERSION, f"JSON record version {v} is not 1")
    missing = [k for k in ("kind", "boot", "seq", "ts_ms", "synced", "r") if k not in top]
    if missing:
        raise RecordError(MALFORMED, f"JSON record lacks {', '.join(missing)}")
    kind = top["kind"]
    if kind not in KIND_CODES:
        raise RecordError(MALFORMED, f"JSON record kind {kind!r:.40} is neither 'sample' nor 'health'")
    for key in ("boot", "seq"):
        if not _is_int(top[key]) or not 0 <= top[key] <= U32_MAX:
            raise RecordError(MALFORMED, f"JSON record '{key}' must be an integer 0..{U32_MAX}, got {top[key]!r:.40}")
    if not _is_int(top["ts_ms"]) or not 0 <= top["ts_ms"] <= MAX_TS_MS:
        raise RecordError(
            MALFORMED,
            f"JSON record 'ts_ms' must be an integer 0..{MAX_TS_MS} (up to the year 9999), got {top['ts_ms']!r:.40}",
        )
    if not isinstance(top["synced"], bool):
        raise RecordError(MALFORMED, f"JSON record 'synced' must be true or false, got {top['synced']!r:.40}")
    if not isinstance(top["r"], _Pairs):
        raise RecordError(MALFORMED, "JSON record 'r' must be an object")
    if len(top["r"]) > MAX_READINGS:
        raise RecordError(MALFORMED, f"{len(top['r'])} readings exceed the maximum of {MAX_READINGS}")
    readings = []
    for name, value in top["r"]:
        ch = CHANNEL_BY_NAME.get(name)
        if ch is None:
            raise RecordError(UNKNOWN_CHANNEL, f"unknown channel name {name!r:.40}")
        if not _is_int(value) or not I32_MIN <= value <= I32_MAX:
            raise RecordError(MALFORMED, f"reading {name} must be a 32-bit integer, got {value!r:.40}")
        readings.append((ch.id, value))
    return Record("json", kind, top["synced"], top["boot"], top["seq"], top["ts_ms"], tuple(readings))


def _check_content(rec: Record) -> None:
    seen = set()
    for channel, _ in rec.readings:
        ch = CHANNELS.get(channel)
        if ch is None:
            raise RecordError(UNKNOWN_CHANNEL, f"unknown channel 0x{channel:02x}")
        if ch.kind != rec.kind:
            raise RecordError(KIND_MISMATCH, f"channel {ch.name} belongs in {ch.kind} records, not {rec.kind}")
        if channel in seen:
            raise RecordError(DUPLICATE_CHANNEL, f"channel {ch.name} appears more than once")
        seen.add(channel)
    for channel, value in rec.readings:
        ch = CHANNELS[channel]
        if (ch.low is not None and value < ch.low) or (ch.high is not None and value > ch.high):
            bounds = f"{'' if ch.low is None else ch.low}..{'' if ch.high is None else ch.high}"
            raise RecordError(OUT_OF_RANGE, f"{ch.name} = {value} is outside {bounds}")


# -- Encoders (test data, tools; the device has its own in firmware/) ----------


def encode_binary(kind: str, boot: int, seq: int, time_ms: int, readings, synced: bool = True) -> bytes:
    """One binary v1 record. `readings`: (channel id, value) pairs; `time_ms`: ms since the Unix epoch."""
    time_s, ms = divmod(time_ms - EPOCH_2020_S * 1000, 1000)
    out = bytearray(HEADER.pack(BINARY_V1, KIND_CODES[kind], int(synced), len(readings), boot, seq, time_s, ms))
    for channel, value in readings:
        out += READING.pack(channel, value)
    return bytes(out)


def encode_json(kind: str, boot: int, seq: int, time_ms: int, readings, synced: bool = True) -> bytes:
    """One JSON v1 record with the same arguments as encode_binary."""
    obj = {
        "v": 1,
        "kind": kind,
        "boot": boot,
        "seq": seq,
        "ts_ms": time_ms,
        "synced": synced,
        "r": {CHANNELS[c].name: v for c, v in readings},
    }
    return json.dumps(obj, separators=(",", ":")).encode()
