"""MQTT 5.0 packets as bytes on the wire: an independent parser with per-packet checks.

Pure functions, no I/O, written from the MQTT 5.0 standard (OASIS, 2019) without
sharing code with the device client (firmware/mqb_packet.py) or paho-mqtt, so a bug
in either cannot hide behind the same bug here. Used by the inspecting proxy
(mqbatch.conformance.proxy) and the conformance harness (mqbatch.conformance.publisher).

    pkt = parse(raw)          # raw: one whole packet (fixed header .. end)
    pkt.type, pkt.name, pkt.fields, pkt.props, pkt.user_props
    pkt.violations            # [(rule id, text)], empty if the packet is well formed

Rule ids (docs/conformance.md): MQTT-FIXED-HEADER, MQTT-VBI, MQTT-MALFORMED,
MQTT-UTF8, MQTT-PROP-ALLOWED, MQTT-PROP-REPEAT, MQTT-PID, MQTT-VERSION (a CONNECT that
is not MQTT 5, e.g. MQTT 3.1.1), MQTT-REASON-CODE (a reason code the packet type does not
define). `pkt.complete` is False when parsing stopped early (fields may be missing): any
byte string parses to a Packet with its violations, never an exception.
"""

from __future__ import annotations

import dataclasses

NAMES = {
    1: "CONNECT",
    2: "CONNACK",
    3: "PUBLISH",
    4: "PUBACK",
    5: "PUBREC",
    6: "PUBREL",
    7: "PUBCOMP",
    8: "SUBSCRIBE",
    9: "SUBACK",
    10: "UNSUBSCRIBE",
    11: "UNSUBACK",
    12: "PINGREQ",
    13: "PINGRESP",
    14: "DISCONNECT",
    15: "AUTH",
}
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
WILL = 0  # pseudo packet type for the Will Properties of a CONNECT

# MQTT 5.0 §2.2.2.2: id -> (name, value kind, packet types where it may appear)
_ACKS = {PUBACK, PUBREC, PUBREL, PUBCOMP}
PROPERTIES = {
    0x01: ("Payload Format Indicator", "byte", {PUBLISH, WILL}),
    0x02: ("Message Expiry Interval", "u32", {PUBLISH, WILL}),
    0x03: ("Content Type", "str", {PUBLISH, WILL}),
    0x08: ("Response Topic", "str", {PUBLISH, WILL}),
    0x09: ("Correlation Data", "bin", {PUBLISH, WILL}),
    0x0B: ("Subscription Identifier", "vbi", {PUBLISH, SUBSCRIBE}),
    0x11: ("Session Expiry Interval", "u32", {CONNECT, CONNACK, DISCONNECT}),
    0x12: ("Assigned Client Identifier", "str", {CONNACK}),
    0x13: ("Server Keep Alive", "u16", {CONNACK}),
    0x15: ("Authentication Method", "str", {CONNECT, CONNACK, AUTH}),
    0x16: ("Authentication Data", "bin", {CONNECT, CONNACK, AUTH}),
    0x17: ("Request Problem Information", "byte", {CONNECT}),
    0x18: ("Will Delay Interval", "u32", {WILL}),
    0x19: ("Request Response Information", "byte", {CONNECT}),
    0x1A: ("Response Information", "str", {CONNACK}),
    0x1C: ("Server Reference", "str", {CONNACK, DISCONNECT}),
    0x1F: ("Reason String", "str", {CONNACK, SUBACK, UNSUBACK, DISCONNECT, AUTH} | _ACKS),
    0x21: ("Receive Maximum", "u16", {CONNECT, CONNACK}),
    0x22: ("Topic Alias Maximum", "u16", {CONNECT, CONNACK}),
    0x23: ("Topic Alias", "u16", {PUBLISH}),
    0x24: ("Maximum QoS", "byte", {CONNACK}),
    0x25: ("Retain Available", "byte", {CONNACK}),
    0x26: ("User Property", "pair", set(NAMES) | {WILL}),
    0x27: ("Maximum Packet Size", "u32", {CONNECT, CONNACK}),
    0x28: ("Wildcard Subscription Available", "byte", {CONNACK}),
    0x29: ("Subscription Identifier Available", "byte", {CONNACK}),
    0x2A: ("Shared Subscription Available", "byte", {CONNACK}),
}
MULTI = {0x26, 0x0B}  # may appear more than once (Subscription Identifier: PUBLISH to a client only)
# fixed-header flags that must be exactly this (MQTT 5.0 §2.1.3); PUBLISH is checked apart
FIXED_FLAGS = {t: (2 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0) for t in NAMES if t != PUBLISH}


class Malformed(Exception):
    """The packet cannot be parsed further: (rule, text)."""

    def __init__(self, rule: str, text: str):
        super().__init__(text)
        self.rule = rule
        self.text = text


def read_vbi(b: bytes, p: int, what: str = "Variable Byte Integer") -> tuple[int, int]:
    """(value, next position). Raises Malformed for > 4 bytes, truncation or a
    non-minimal encoding (MQTT 5.0 §1.5.5: the minimum number of bytes must be used)."""
    v = shift = 0
    start = p
    while True:
        if p >= len(b):
            raise Malformed("MQTT-MALFORMED", f"{what} truncated")
        c = b[p]
        v |= (c & 0x7F) << shift
        p += 1
        if not c & 0x80:
            break
        shift += 7
        if p - start == 4:
            raise Malformed("MQTT-VBI", f"{what} longer than 4 bytes")
    if p - start > 1 and b[p - 1] == 0:
        raise Malformed("MQTT-VBI", f"{what} not minimally encoded ({b[start:p].hex()})")
    return v, p


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        n, c = n >> 7, n & 0x7F
        out.append(c | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet_len(b: bytes) -> int | None:
    """Length of the whole packet at the start of b, or None if b does not yet hold its
    header. Raises Malformed if the Remaining Length is longer than 4 bytes."""
    if len(b) < 2:
        return None
    try:
        n, p = read_vbi(b, 1, "Remaining Length")
    except Malformed as e:
        if e.rule == "MQTT-MALFORMED":
            return None
        if "not minimally" in e.text:  # still delimits the packet; parse() reports it
            v = shift = 0
            p = 1
            while b[p] & 0x80:
                v |= (b[p] & 0x7F) << shift
                shift += 7
                p += 1
            return p + 1 + (v | (b[p] << shift))
        raise
    return p + n


@dataclasses.dataclass
class Packet:
    raw: bytes
    type: int = 0
    flags: int = 0
    fields: dict = dataclasses.field(default_factory=dict)
    props: dict = dataclasses.field(default_factory=dict)  # id -> value (last one for MULTI ids)
    user_props: list = dataclasses.field(default_factory=list)  # [(key, value)]
    violations: list = dataclasses.field(default_factory=list)  # [(rule, text)]
    complete: bool = False  # parsed to its end (every field present)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, f"type-{self.type}")

    @property
    def size(self) -> int:
        return len(self.raw)

    def summary(self) -> str:
        f = self.fields
        bits = [self.name]
        for k in ("qos", "dup", "retain", "pid", "topic", "alias", "reason", "session_present", "clean_start"):
            if k in f and f[k] not in (None, False, "") and not (k == "qos" and not f[k]):
                bits.append(f"{k}={f[k]:#04x}" if k == "reason" else f"{k}={f[k]}")
        bits.append(f"{self.size}B")
        return " ".join(bits)


class _Reader:
    def __init__(self, pkt: Packet, b: bytes, p: int, end: int):
        self.pkt, self.b, self.p, self.end = pkt, b, p, end

    def left(self) -> int:
        return self.end - self.p

    def take(self, n: int, what: str) -> bytes:
        if self.p + n > self.end:
            raise Malformed("MQTT-MALFORMED", f"{what} truncated ({n} bytes needed, {self.end - self.p} left)")
        v = self.b[self.p : self.p + n]
        self.p += n
        return v

    def u8(self, what):
        return self.take(1, what)[0]

    def u16(self, what):
        return int.from_bytes(self.take(2, what), "big")

    def u32(self, what):
        return int.from_bytes(self.take(4, what), "big")

    def vbi(self, what):
        v, self.p = read_vbi(self.b[: self.end], self.p, what)
        return v

    def binary(self, what):
        return self.take(self.u16(what), what)

    def string(self, what) -> str:
        data = self.binary(what)
        try:
            s = data.decode("utf-8")
        except UnicodeDecodeError as e:
            self.pkt.violations.append(("MQTT-UTF8", f"{what} is not valid UTF-8: {e.reason} at byte {e.start}"))
            return data.decode("utf-8", "replace")
        if "\x00" in s:
            self.pkt.violations.append(("MQTT-UTF8", f"{what} contains U+0000"))
        # surrogates cannot come out of a strict UTF-8 decode; other non-characters are allowed (SHOULD NOT)
        return s

    def properties(self, ptype: int, where: str) -> tuple[dict, list]:
        n = self.vbi(f"{where} Property Length")
        end = self.p + n
        if end > self.end:
            raise Malformed("MQTT-MALFORMED", f"{where} Property Length {n} runs past the packet")
        props: dict = {}
        users: list = []
        seen: set = set()
        outer_end, self.end = self.end, end
        try:
            while self.p < end:
                pid = self.vbi(f"{where} property identifier")
                if pid not in PROPERTIES:
                    raise Malformed("MQTT-PROP-ALLOWED", f"{where}: unknown property identifier 0x{pid:02x}")
                name, kind, allowed = PROPERTIES[pid]
                if ptype not in allowed:
                    self.pkt.violations.append(
                        (
                            "MQTT-PROP-ALLOWED",
                            f"{where}: {name} (0x{pid:02x}) is not allowed in {NAMES.get(ptype, 'Will')}",
                        )
                    )
                if pid in seen and pid not in MULTI:
                    self.pkt.violations.append(
                        ("MQTT-PROP-REPEAT", f"{where}: {name} (0x{pid:02x}) appears more than once")
                    )
                seen.add(pid)
                if kind == "byte":
                    v = self.u8(name)
                elif kind == "u16":
                    v = self.u16(name)
                elif kind == "u32":
                    v = self.u32(name)
                elif kind == "vbi":
                    v = self.vbi(name)
                elif kind == "str":
                    v = self.string(name)
                elif kind == "bin":
                    v = self.binary(name)
                else:
                    v = (self.string("User Property name"), self.string("User Property value"))
                    users.append(v)
                props[pid] = v
        finally:
            self.end = outer_end
        return props, users


def parse(raw: bytes) -> Packet:
    """Parse one whole packet. Never raises: problems are in .violations."""
    pkt = Packet(bytes(raw))
    b = pkt.raw
    try:
        if len(b) < 2:
            raise Malformed("MQTT-MALFORMED", "fewer than 2 bytes")
        pkt.type, pkt.flags = b[0] >> 4, b[0] & 0x0F
        if pkt.type == 0:
            raise Malformed("MQTT-FIXED-HEADER", "packet type 0 is reserved")
        n, p = read_vbi(b, 1, "Remaining Length")
        if p + n != len(b):
            raise Malformed("MQTT-MALFORMED", f"Remaining Length {n} but {len(b) - p} bytes follow the header")
        if pkt.type != PUBLISH and pkt.flags != FIXED_FLAGS[pkt.type]:
            pkt.violations.append(
                ("MQTT-FIXED-HEADER", f"{pkt.name} with flags 0x{pkt.flags:x} (must be 0x{FIXED_FLAGS[pkt.type]:x})")
            )
        _BODY[pkt.type](pkt, _Reader(pkt, b, p, len(b)))
        pkt.complete = True
    except Malformed as e:
        pkt.violations.append((e.rule, e.text))
    return pkt


def _connect(pkt, r):
    f = pkt.fields
    name = r.string("Protocol Name")
    level = r.u8("Protocol Version")
    if name != "MQTT" or level != 5:
        known = {("MQIsdp", 3): "MQTT 3.1", ("MQTT", 4): "MQTT 3.1.1"}.get((name, level), "unknown protocol")
        raise Malformed(
            "MQTT-VERSION", f"CONNECT with protocol name {name!r} level {level} ({known}): not MQTT 5 [MQTT-3.1.2-2]"
        )
    flags = r.u8("Connect Flags")
    if flags & 1:
        pkt.violations.append(("MQTT-FIXED-HEADER", "CONNECT reserved flag bit 0 set"))
    f.update(
        clean_start=bool(flags & 2),
        keepalive=r.u16("Keep Alive"),
        will=bool(flags & 4),
        will_qos=(flags >> 3) & 3,
        will_retain=bool(flags & 32),
    )
    if f["will_qos"] == 3 or (not f["will"] and (f["will_qos"] or f["will_retain"])):
        pkt.violations.append(("MQTT-FIXED-HEADER", f"CONNECT Will flags inconsistent (0x{flags:02x})"))
    pkt.props, pkt.user_props = r.properties(CONNECT, "CONNECT")
    f["client_id"] = r.string("Client Identifier")
    if flags & 4:
        f["will_props"], _ = r.properties(WILL, "Will")
        f["will_topic"] = r.string("Will Topic")
        r.binary("Will Payload")
    if flags & 0x80:
        f["username"] = r.string("User Name")
    if flags & 0x40:
        r.binary("Password")
    if r.left():
        raise Malformed("MQTT-MALFORMED", f"{r.left()} bytes after the CONNECT payload")


def _connack(pkt, r):
    ack = r.u8("Connect Acknowledge Flags")
    if ack & 0xFE:
        pkt.violations.append(("MQTT-FIXED-HEADER", f"CONNACK reserved acknowledge flags 0x{ack:02x}"))
    pkt.fields.update(session_present=bool(ack & 1), reason=r.u8("Reason Code"))
    pkt.props, pkt.user_props = r.properties(CONNACK, "CONNACK")
    _end(pkt, r)


def _publish(pkt, r):
    f = pkt.fields
    qos = (pkt.flags >> 1) & 3
    f.update(dup=bool(pkt.flags & 8), qos=qos, retain=bool(pkt.flags & 1))
    if qos == 3:
        raise Malformed("MQTT-FIXED-HEADER", "PUBLISH with QoS 3")
    if f["dup"] and qos == 0:
        pkt.violations.append(("MQTT-FIXED-HEADER", "PUBLISH QoS 0 with DUP=1 [MQTT-3.3.1-2]"))
    f["topic"] = r.string("Topic Name")
    if "+" in f["topic"] or "#" in f["topic"]:
        pkt.violations.append(("MQTT-MALFORMED", f"Topic Name {f['topic']!r} holds a wildcard"))
    f["pid"] = r.u16("Packet Identifier") if qos else None
    if qos and f["pid"] == 0:
        pkt.violations.append(("MQTT-PID", "PUBLISH with QoS > 0 has Packet Identifier 0"))
    pkt.props, pkt.user_props = r.properties(PUBLISH, "PUBLISH")
    f["alias"] = pkt.props.get(0x23)
    f["payload"] = r.take(r.left(), "payload")


# MQTT 5.0 §3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.14.2.1, 3.15.2.1: the Reason Codes each packet may carry
_PUB_ACK_CODES = {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}
REASON_CODES = {
    PUBACK: (_PUB_ACK_CODES, "[MQTT-3.4.2-1]"),
    PUBREC: (_PUB_ACK_CODES, "[MQTT-3.5.2-1]"),
    PUBREL: ({0x00, 0x92}, "[MQTT-3.6.2-1]"),
    PUBCOMP: ({0x00, 0x92}, "[MQTT-3.7.2-1]"),
    DISCONNECT: (
        {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96}
        | {0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2},
        "[MQTT-3.14.2-1]",
    ),
    AUTH: ({0x00, 0x18, 0x19}, "[MQTT-3.15.2-1]"),
}


def _reason(pkt, r):
    code = r.u8("Reason Code") if r.left() else 0
    codes, sid = REASON_CODES[pkt.type]
    if code not in codes:
        pkt.violations.append(("MQTT-REASON-CODE", f"{pkt.name} Reason Code 0x{code:02x} is not defined for it {sid}"))
    return code


def _ack(pkt, r):
    f = pkt.fields
    f["pid"] = r.u16("Packet Identifier")
    if f["pid"] == 0:
        pkt.violations.append(("MQTT-PID", f"{pkt.name} with Packet Identifier 0"))
    f["reason"] = _reason(pkt, r)
    if r.left():
        pkt.props, pkt.user_props = r.properties(pkt.type, pkt.name)
    _end(pkt, r)


def _subscribe(pkt, r):
    _ack_pid_props(pkt, r)
    filters = []
    while r.left():
        filters.append((r.string("Topic Filter"), r.u8("Subscription Options")))
    if not filters:
        raise Malformed("MQTT-MALFORMED", f"{pkt.name} without a topic filter")
    pkt.fields["filters"] = filters


def _unsubscribe(pkt, r):
    _ack_pid_props(pkt, r)
    filters = []
    while r.left():
        filters.append(r.string("Topic Filter"))
    if not filters:
        raise Malformed("MQTT-MALFORMED", f"{pkt.name} without a topic filter")
    pkt.fields["filters"] = filters


def _suback(pkt, r):
    _ack_pid_props(pkt, r)
    pkt.fields["codes"] = list(r.take(r.left(), "reason codes"))


def _ack_pid_props(pkt, r):
    pkt.fields["pid"] = r.u16("Packet Identifier")
    if pkt.fields["pid"] == 0:
        pkt.violations.append(("MQTT-PID", f"{pkt.name} with Packet Identifier 0"))
    pkt.props, pkt.user_props = r.properties(pkt.type, pkt.name)


def _empty(pkt, r):
    if r.left():
        raise Malformed("MQTT-MALFORMED", f"{pkt.name} with a {r.left()}-byte body")


def _reason_props(pkt, r):
    pkt.fields["reason"] = _reason(pkt, r)
    if r.left():
        pkt.props, pkt.user_props = r.properties(pkt.type, pkt.name)
    _end(pkt, r)


def _end(pkt, r):
    if r.left():
        raise Malformed("MQTT-MALFORMED", f"{r.left()} bytes after the end of {pkt.name}")


_BODY = {
    CONNECT: _connect,
    CONNACK: _connack,
    PUBLISH: _publish,
    PUBACK: _ack,
    PUBREC: _ack,
    PUBREL: _ack,
    PUBCOMP: _ack,
    SUBSCRIBE: _subscribe,
    SUBACK: _suback,
    UNSUBSCRIBE: _unsubscribe,
    UNSUBACK: _suback,
    PINGREQ: _empty,
    PINGRESP: _empty,
    DISCONNECT: _reason_props,
    AUTH: _reason_props,
}


def batch_payload_count(payload: bytes) -> tuple[int, str | None]:
    """Sub-messages in a batch-format v1 payload (spec §2.3): (count, problem or None).
    Independent of mqbatch.wire.codec on purpose."""
    p = count = 0
    while p < len(payload):
        try:
            n, p = read_vbi(payload, p, f"sub-message {count + 1} length")
        except Malformed as e:
            return count, e.text
        if p + n > len(payload):
            return count, f"sub-message {count + 1} declares {n} bytes, {len(payload) - p} remain"
        p += n
        count += 1
    return count, None
