#!/usr/bin/env python3
"""Fuzz the recorder's handling of PUBLISH properties, without a broker, at the
scale a real broker cannot reach (issue 10: >= 10 M inputs).

    .venv/bin/python tests/security/fuzz_recorder_props.py --cases 10000000 [--seed N]

Each case is one incoming MQTT 5 PUBLISH packet, built byte by byte here (not by
paho): topic (any UTF-8 but U+0000 and the MQTT-forbidden code points, or
sometimes invalid UTF-8), QoS 0/1, a property block with any mix of the
properties a broker may forward on a PUBLISH (User Property repeated 0..60 times
with empty, long, non-ASCII, JSON-hostile strings; Content Type; Payload Format
Indicator 0/1; Message Expiry Interval 0..2^32-1; Response Topic; Correlation
Data; Subscription Identifiers), and a random payload. A quarter
of the cases then have random bytes flipped, cut or inserted anywhere in the
packet (what a broker would never forward: the recorder must still not misland).

The packet goes through paho-mqtt's own PUBLISH handler (Client._handle_publish,
the code the recorder's network thread runs) into the recorder's conversion
(mqbatch.ingest.recorder.landed_from_message), then through the WAL encoding
(Landed.encode / decode) and, per 1,000 cases, into an Arrow table
(landing.to_table) as the roll to Parquet does.

Invariants, for every case:
- a well-formed packet is landed exactly: topic, payload, every user property in
  order, content type, payload format indicator, message expiry, QoS, retain, dup;
  the WAL round trip and the Arrow table give back the same values;
- a mutated packet is either refused by paho's parser (an exception before the
  recorder sees a message: the real client then drops the connection and the
  broker redelivers nothing it did not send) or landed exactly as paho parsed it;
- nothing raises inside the recorder's own code.
Prints the number of cases, how many paho refused, and failures (exit 1 on any).
Also used by tests/security/test_security_fuzz.py (a bounded run in `make test`).
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.ingest import landing
from mqbatch.ingest.recorder import landed_from_message
from mqbatch.wire import codec

# property identifiers a broker may send on a PUBLISH (MQTT 5.0 section 3.3.2.3)
PFI, EXPIRY, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION, SUB_ID, USER = 1, 2, 3, 8, 9, 11, 38

# strings that stress UTF-8 handling, JSON escaping in the WAL and Arrow/Parquet strings
NASTY = [
    "",
    " ",
    "\"",
    "\\",
    "\\u0000",
    "{\"k\":1}",
    "é",
    "日本語",
    "\u202e",
    "\ufeff",
    "😀",
    "\U0010fffd",
    "batch-format",
    "batch-size",
    "batch-hmac",
    "a" * 300,
    "\t\n\r",
    "</script>",
    "%s%n",
    "\u2028\u2029",
]


def _allowed(c: int) -> bool:
    """MQTT forbids surrogates, U+0000 and (SHOULD NOT) controls and non-characters; Mosquitto refuses them."""
    return not (
        0xD800 <= c <= 0xDFFF or c < 0x20 or 0x7F <= c <= 0x9F or (c & 0xFFFE) == 0xFFFE or 0xFDD0 <= c <= 0xFDEF
    )


ASCII = [chr(c) for c in range(0x20, 0x7F)]
# every allowed BMP character and every 97th allowed one above it (U+FEFF included)
UNICODE = [chr(c) for c in range(0x20, 0x10000) if _allowed(c)] + [
    chr(c) for c in range(0x10000, 0x110000, 97) if _allowed(c)
]


def _text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return rng.choice(NASTY)
    return "".join(rng.choices(ASCII if r < 0.7 else UNICODE, k=rng.randint(0, 24 if r < 0.7 else 16)))


def _utf8(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def generate(rng: random.Random) -> tuple[int, bytes, dict]:
    """(command byte, PUBLISH body after the fixed header, what must be landed)."""
    qos = rng.choice([0, 1])
    retain, dup = rng.random() < 0.1, qos > 0 and rng.random() < 0.1
    if rng.random() < 0.03:
        topic_bytes, topic = b"mqbatch/\xff\xfe/telemetry", None  # invalid UTF-8: landed with U+FFFD
    else:
        topic = rng.choice(["mqbatch/dev-001/telemetry", "mqbatch/" + _text(rng) + "/telemetry", _text(rng) or "t"])
        topic_bytes = topic.encode()
    body = struct.pack("!H", len(topic_bytes)) + topic_bytes
    if qos:
        body += struct.pack("!H", rng.randint(1, 65535))
    props, want, seen = b"", {"user": [], "ct": None, "pfi": None, "mei": None}, set()
    for _ in range(rng.choice([0, 1, 2, 3, 5, 8])):
        kind = rng.choice([USER, USER, USER, CONTENT_TYPE, PFI, EXPIRY, RESPONSE_TOPIC, CORRELATION, SUB_ID])
        if kind == USER:
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5, 60])):
                k, v = _text(rng), _text(rng)
                props += bytes([USER]) + _utf8(k) + _utf8(v)
                want["user"].append((k, v))
        elif kind == CONTENT_TYPE and want["ct"] is None:
            want["ct"] = _text(rng)
            props += bytes([CONTENT_TYPE]) + _utf8(want["ct"])
        elif kind == PFI and want["pfi"] is None:
            want["pfi"] = rng.choice([0, 1])
            props += bytes([PFI, want["pfi"]])
        elif kind == EXPIRY and want["mei"] is None:
            want["mei"] = rng.choice([0, 1, 3600, 2**32 - 1, rng.randint(0, 2**32 - 1)])
            props += bytes([EXPIRY]) + struct.pack("!I", want["mei"])
        elif kind == RESPONSE_TOPIC and RESPONSE_TOPIC not in seen:
            seen.add(RESPONSE_TOPIC)
            props += bytes([RESPONSE_TOPIC]) + _utf8(_text(rng) or "r")
        elif kind == CORRELATION and CORRELATION not in seen:
            seen.add(CORRELATION)
            data = rng.randbytes(rng.randint(0, 40))
            props += bytes([CORRELATION]) + struct.pack("!H", len(data)) + data
        elif kind == SUB_ID:
            props += bytes([SUB_ID]) + codec.vbi_encode(rng.randint(1, 268_435_455))
    payload = rng.randbytes(rng.choice([0, 1, 30, 500]))
    body += codec.vbi_encode(len(props)) + props + payload
    want.update(
        topic="mqbatch/\ufffd\ufffd/telemetry" if topic is None else topic,
        payload=payload,
        qos=qos,
        retain=retain,
        dup=dup,
    )
    command = 0x30 | (dup << 3) | (qos << 1) | retain
    return command, body, want


def mutate(rng: random.Random, body: bytes) -> bytes:
    b = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.5 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif r < 0.75 and b:
            del b[rng.randrange(len(b)) :]
        else:
            at = rng.randint(0, len(b))
            b[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(b)


class Harness:
    """paho's PUBLISH handler feeding the recorder's conversion, as in mqbatch.ingest.recorder."""

    def __init__(self):
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client._sock_send = lambda *a: None  # no socket: a PUBACK is built and dropped
        self.client._packet_queue = lambda *a, **k: mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
        self.client.on_message = self._on_message
        self.landed: list = []
        self.msg = None

    def _on_message(self, client, userdata, msg):
        self.msg = msg
        self.landed.append(landed_from_message(msg, 1))  # the recorder's own code: must never raise

    def feed(self, command: int, body: bytes):
        """The Landed row, or None if paho refused the packet (the reason in self.refused)."""
        self.msg = self.refused = None
        self.client._in_packet = {"command": command, "packet": body, "remaining_length": len(body)}
        n = len(self.landed)
        try:
            self.client._handle_publish()
        except Exception as e:  # paho's parser refused it (struct.error, MQTTException, ...)
            if len(self.landed) != n:
                raise AssertionError(f"paho raised after the recorder landed the message: {e!r}")
            self.refused = e
            return None
        return self.landed[-1] if len(self.landed) > n else None


def expected_from_paho(msg) -> dict:
    """What paho parsed, independently of landed_from_message, for mutated packets."""
    p = msg.properties
    try:
        topic = msg.topic
    except UnicodeDecodeError:
        topic = msg._topic.decode("utf-8", "replace")
    return {
        "topic": topic,
        "payload": bytes(msg.payload),
        "user": list(getattr(p, "UserProperty", None) or []),
        "ct": getattr(p, "ContentType", None),
        "pfi": getattr(p, "PayloadFormatIndicator", None),
        "mei": getattr(p, "MessageExpiryInterval", None),
        "qos": msg.qos,
        "retain": msg.retain,
        "dup": msg.dup,
    }


def check(row: landing.Landed, want: dict) -> str | None:
    got = {
        "topic": row.topic,
        "payload": row.payload,
        "user": row.user_properties,
        "ct": row.content_type,
        "pfi": row.payload_format_indicator,
        "mei": row.message_expiry_interval,
        "qos": row.qos,
        "retain": row.retain,
        "dup": row.dup,
    }
    for k, v in want.items():
        if got[k] != v:
            return f"{k}: landed {got[k]!r:.200}, expected {v!r:.200}"
    back = landing.Landed.decode(row.encode())
    if back != row:
        return f"WAL round trip changed the row: {back!r:.300}"
    return None


def run(cases: int, seed: int, progress_s: float = 0.0, out=sys.stdout) -> dict:
    rng = random.Random(seed)
    h = Harness()
    stats = {"cases": 0, "refused_by_paho": 0, "mutated": 0, "user_properties": 0, "failures": []}
    pending: list[tuple[landing.Landed, dict]] = []
    started = last = time.monotonic()
    for i in range(cases):
        command, body, want = generate(rng)
        mutated = rng.random() < 0.25
        if mutated:
            body = mutate(rng, body)
            stats["mutated"] += 1
        try:
            row = h.feed(command, body)
        except Exception as e:  # the recorder's own code raised: a failure
            stats["failures"].append(f"case {i}: recorder raised {e!r}")
            continue
        stats["cases"] += 1
        if row is None:
            if not mutated:
                stats["failures"].append(f"case {i}: paho refused a well-formed packet: {h.refused!r}")
            stats["refused_by_paho"] += 1
            continue
        if mutated:
            want = expected_from_paho(h.msg)
        stats["user_properties"] += len(row.user_properties)
        err = check(row, want)
        if err:
            stats["failures"].append(f"case {i}: {err}")
        pending.append((row, want))
        if len(pending) >= 1000 or i == cases - 1:
            _check_table(pending, stats, i)
            pending = []
        if progress_s and time.monotonic() - last >= progress_s:
            last = time.monotonic()
            print(
                f"{i + 1:,} cases, {stats['refused_by_paho']:,} refused by paho, "
                f"{len(stats['failures'])} failures, {last - started:.0f} s",
                file=out,
                flush=True,
            )
    if pending:
        _check_table(pending, stats, cases - 1)
    h.landed.clear()
    return stats


def _check_table(pending, stats, i) -> None:
    """The Arrow table the roll to Parquet writes holds the same values."""
    rows = [r for r, _ in pending]
    try:
        t = landing.to_table(rows, "fuzz", 0).to_pydict()
    except Exception as e:
        stats["failures"].append(f"cases up to {i}: to_table raised {e!r}")
        return
    for j, (r, _want) in enumerate(pending):
        up = [(p["key"], p["value"]) for p in t["user_properties"][j]]
        if (t["topic"][j], t["payload"][j], up) != (r.topic, r.payload, r.user_properties):
            stats["failures"].append(f"cases up to {i}: Arrow row {j} differs from the landed row")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--progress-s", type=float, default=30.0)
    a = ap.parse_args(argv)
    t = time.monotonic()
    s = run(a.cases, a.seed, a.progress_s)
    print(
        f"fuzz_recorder_props: {s['cases']:,} cases (seed {a.seed}), {s['mutated']:,} mutated, "
        f"{s['refused_by_paho']:,} refused by paho's parser, {s['user_properties']:,} user properties landed, "
        f"{len(s['failures'])} failures, {time.monotonic() - t:.0f} s"
    )
    for f in s["failures"][:10]:
        print("  " + f)
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
