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


# -- differential: the recorder's PUBLISH property parser against paho's own ---------------

PUBLISH_IDS = [PFI, EXPIRY, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION, SUB_ID, 35, USER]  # 35: Topic Alias
ALL_IDS = [1, 2, 3, 8, 9, 11, 17, 18, 19, 21, 22, 23, 24, 25, 26, 28, 31, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]


# MQTT 5.0 section 2.2.2.2: each property's value type
TYPE_OF = {
    **dict.fromkeys([1, 23, 25, 36, 37, 40, 41, 42], "byte"),
    **dict.fromkeys([19, 33, 34, 35], "int2"),
    **dict.fromkeys([2, 17, 24, 39], "int4"),
    11: "vbi",
    **dict.fromkeys([9, 22], "binary"),
    **dict.fromkeys([3, 8, 18, 21, 26, 28, 31], "utf8"),
    38: "pair",
}


def odd_properties(rng: random.Random) -> bytes:
    """A property block of any identifiers (also ones not allowed on a PUBLISH, unknown ones,
    two-byte ones), repeated single properties, values out of paho's ranges, strings and
    binary data whose lengths run past the block: what a broker would not forward."""
    parts = []  # whole properties, each identifier and value
    for _ in range(rng.choice([1, 2, 3, 5])):
        r = rng.random()
        if r < 0.5:
            ident = rng.choice(PUBLISH_IDS)
        else:
            ident = rng.choice(ALL_IDS) if r < 0.8 else rng.choice([0, 4, 127, 0x81, 0xA6, 255])
        prop = bytes([ident]) if ident < 128 or rng.random() < 0.5 else bytes([ident, 0])
        kind = TYPE_OF.get(ident) if rng.random() < 0.6 else None
        if kind is not None:  # a value of the identifier's type, at the edges of paho's ranges
            prop += {
                "byte": lambda: bytes([rng.choice([0, 1, 2, 255])]),
                "int2": lambda: struct.pack("!H", rng.choice([0, 1, 65535])),
                "int4": lambda: struct.pack("!I", rng.choice([0, 1, 2**32 - 1])),
                "vbi": lambda: codec.vbi_encode(rng.choice([0, 1, 268_435_455])),
                "binary": lambda: struct.pack("!H", 3) + b"\x00\xff\x01",
                "utf8": lambda: _utf8(_text(rng)),
                "pair": lambda: _utf8(_text(rng)) + _utf8(_text(rng)),
            }[kind]()
            parts.append(prop)
            continue
        shape = rng.random()
        if shape < 0.3:
            prop += bytes([rng.choice([0, 1, 2, 255])])
        elif shape < 0.5:
            prop += struct.pack("!H", rng.choice([0, 1, 65535])) + struct.pack("!I", rng.randint(0, 2**32 - 1))
        elif shape < 0.8:
            text = _text(rng).encode()
            prop += struct.pack("!H", len(text) + rng.choice([0, 0, 0, 1, 40])) + text
        else:
            prop += codec.vbi_encode(rng.choice([0, 1, 268_435_455]))
        parts.append(prop)
    if rng.random() < 0.3:  # one of them again, whole (a single property must not be twice)
        parts.insert(rng.randint(0, len(parts)), rng.choice(parts))
    props = b"".join(parts)
    if rng.random() < 0.2:
        props = props[: rng.randint(0, len(props))]
    stated = len(props) + rng.choice([0, 0, 0, -1, 1, 5])
    return codec.vbi_encode(max(0, stated)) + props


def _outcome(h: Harness, command: int, body: bytes) -> tuple:
    """What paho's PUBLISH handler made of body: the refusal, or every attribute of the
    message's Properties (paho's tables included) with the topic, payload and flags."""
    row = h.feed(command, body)
    if row is None:
        return ("refused", type(h.refused).__name__, str(h.refused))
    m = h.msg
    return ("landed", dict(m.properties.__dict__), m._topic, bytes(m.payload), m.qos, m.mid, m.retain, m.dup)


def differential(cases: int, seed: int) -> dict:
    """Feed each case through paho's PUBLISH handler twice, with the recorder's property
    parser (mqbatch.util.paho_compat, installed) and with paho's own (read_utf kept in
    both: the U+FEFF fix is not what is compared); every outcome must be the same."""
    import paho.mqtt.properties as props

    from mqbatch.util import paho_compat

    rng = random.Random(seed)
    h = Harness()
    stats = {"cases": 0, "odd": 0, "refused": 0, "fast_path": 0, "failures": []}
    paho_compat.install()
    ours = (props.Properties.unpack, props.Properties.__init__)
    taken = [0]

    def counting_parse(b, _parse=paho_compat._parse):
        out = _parse(b)
        taken[0] += 1
        return out

    paho_compat._parse = counting_parse
    try:
        for i in range(cases):
            command, body, _ = generate(rng)
            r = rng.random()
            if r < 0.3:  # the same topic and id, an odd property block
                at = 2 + (body[0] << 8 | body[1]) + (2 if command & 0x06 else 0)
                body = body[:at] + odd_properties(rng) + rng.randbytes(rng.choice([0, 3, 30]))
                stats["odd"] += 1
            elif r < 0.5:
                body = mutate(rng, body)
            props.Properties.unpack, props.Properties.__init__ = ours
            got = _outcome(h, command, body)
            props.Properties.unpack, props.Properties.__init__ = paho_compat.PAHO_UNPACK, paho_compat.PAHO_INIT
            want = _outcome(h, command, body)
            stats["cases"] += 1
            stats["refused"] += want[0] == "refused"
            if got != want:
                stats["failures"].append(f"case {i}: recorder's parser {got!r:.300}, paho's {want!r:.300}")
    finally:
        paho_compat._parse = counting_parse.__defaults__[0]
        paho_compat.install()
        h.landed.clear()
    stats["fast_path"] = taken[0]
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--progress-s", type=float, default=30.0)
    ap.add_argument(
        "--differential",
        action="store_true",
        help="compare the recorder's PUBLISH property parser with paho's own, case by case",
    )
    a = ap.parse_args(argv)
    t = time.monotonic()
    if a.differential:
        d = differential(a.cases, a.seed)
        print(
            f"fuzz_recorder_props --differential: {d['cases']:,} cases (seed {a.seed}), {d['odd']:,} with odd property "
            f"blocks, {d['refused']:,} refused by paho, {d['fast_path']:,} parsed by the recorder's own path, "
            f"{len(d['failures'])} differences, {time.monotonic() - t:.0f} s"
        )
        return _failures(d["failures"])
    s = run(a.cases, a.seed, a.progress_s)
    print(
        f"fuzz_recorder_props: {s['cases']:,} cases (seed {a.seed}), {s['mutated']:,} mutated, "
        f"{s['refused_by_paho']:,} refused by paho's parser, {s['user_properties']:,} user properties landed, "
        f"{len(s['failures'])} failures, {time.monotonic() - t:.0f} s"
    )
    return _failures(s["failures"])


def _failures(failures: list[str]) -> int:
    """Print the first ten; the exit status."""
    for f in failures[:10]:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
