"""The device client's handling of packets a real broker will not send: every reason
code in CONNACK / PUBACK / PUBREC / PUBCOMP / DISCONNECT, malformed, truncated and
oversized packets, protocol violations. A scripted fake server (CPython sockets)
plays the broker; the client is firmware/mqb_client.py in the MicroPython Unix port.
Each case must end in a named, reported result, never a crash."""

from __future__ import annotations

import socket

import pytest

from mqbatch_testing.broker import of
from mqbatch_testing.fake_server import (  # noqa: F401
    CONNACK_CODES,
    CONNACK_OK,
    DISCONNECT_CODES,
    PUBACK_CODES,
    PUBCOMP_CODES,
    TOPIC,
    Conn,
    FakeServer,
    drive,
    packet,
    pid_of,
    props,
    results,
    string,
    vbi,
)

C = {"continue": True}


def test_every_connack_reason_code(tmp_path):
    def scenario(code):
        def run(c: Conn):
            c.expect(1)
            body = bytes([0, code]) + (
                props(string(0x1F, f"no-{code:02x}"), string(0x1C, "other:8883")) if code >= 0x80 else props()
            )
            c.send(packet(0x20, body))

        return run

    server = FakeServer([scenario(code) for code in range(256)])
    steps = []
    for _ in range(256):
        steps += [["connect", C], ["drop", {}]]
    ev = results(drive(server, steps, tmp_path))
    assert len(ev) == 256
    for code, e in enumerate(ev):
        if code == 0:
            assert e["event"] == "connack"
        elif code in CONNACK_CODES:
            assert (e["event"], e["code"], e["packet"], e["local"], e["reason"]) == (
                "error",
                code,
                "CONNACK",
                False,
                f"no-{code:02x}",
            ), e
            assert f"0x{code:02X}" in e["message"] and "other:8883" in e["message"]
        else:
            assert (e["code"], e["local"]) == (0x81, True), e
            assert "reason code not defined for this packet" in e["message"]


def _ack_server(ptype: int, code: int, qos: int):
    """CONNACK ok; answer the PUBLISH's step `ptype` (4 PUBACK, 5 PUBREC, 7 PUBCOMP) with `code`."""

    def reply(c: Conn, first: int, pid: bytes, rc: int):
        extra = props(string(0x1F, f"r-{rc:02x}")) if rc >= 0x80 else b""
        c.send(packet(first, pid + bytes([rc]) + extra))

    def run(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        pid = pid_of(c.expect(3))
        if qos == 1:
            reply(c, 0x40, pid, code)
            return
        reply(c, 0x50, pid, code if ptype == 5 else 0)
        if ptype == 7 or code in (0x00, 0x10):
            assert c.expect(6) == pid  # PUBREL
            reply(c, 0x70, pid, code if ptype == 7 else 0)

    return run


@pytest.mark.parametrize(
    "ptype, codes, qos",
    [(4, PUBACK_CODES, 1), (5, PUBACK_CODES, 2), (7, PUBCOMP_CODES, 2)],
    ids=["PUBACK", "PUBREC", "PUBCOMP"],
)
def test_every_ack_reason_code(ptype, codes, qos, tmp_path):
    server = FakeServer([_ack_server(ptype, code, qos) for code in range(256)])
    steps = []
    for _ in range(256):
        steps += [
            ["connect", C],
            ["publish", {"topic": TOPIC, "qos": qos, "service": False, **C}],
            ["flush", {"timeout_ms": 3000, **C}],
            ["disconnect", C],
            ["drop", {}],
        ]
    ev = drive(server, steps, tmp_path, client={"session_expiry": 0})
    outcome = [e for e in results(ev) if e["event"] != "connack"]
    outcome = [e for e in outcome if not (e["event"] == "ack" and e["code"] == -3)]  # SESSION_LOST of a failed one
    assert len(outcome) == 256, outcome[:5]
    for code, e in enumerate(outcome):
        conn = server.conns[code]
        if code in codes:
            final = 0 if ptype == 5 and code < 0x80 else code  # a successful PUBREC ends with PUBCOMP 0
            assert e["event"] == "ack" and e["code"] == final, (code, e)
            assert e["reason"] == (f"r-{code:02x}" if code >= 0x80 else None)
            # PUBREL follows a successful PUBREC only; a refused message ends the flow
            assert (6 in conn.types()) == (qos == 2 and (ptype == 7 or code < 0x80)), (code, conn.types())
            assert conn.types()[-1] == 14  # the client's DISCONNECT
        else:
            assert e["event"] == "error" and (e["code"], e["local"]) == (0x81, True), (code, e)
            assert conn.received[-1] == (0xE0, b"\x81")  # the client said why before closing


def test_every_disconnect_reason_code(tmp_path):
    def scenario(code):
        def run(c: Conn):
            c.expect(1)
            c.send(CONNACK_OK)
            c.send(packet(0xE0, bytes([code]) + props(string(0x1F, f"bye-{code:02x}"), string(0x1C, "b.example"))))

        return run

    server = FakeServer([scenario(code) for code in range(256)])
    steps = []
    for _ in range(256):
        steps += [["connect", C], ["service_for", {"ms": 3000, **C}], ["drop", {}]]
    ev = [e for e in results(drive(server, steps, tmp_path)) if e["event"] == "error"]
    assert len(ev) == 256
    for code, e in enumerate(ev):
        if code in DISCONNECT_CODES:
            assert (e["code"], e["packet"], e["local"], e["reason"]) == (code, "DISCONNECT", False, f"bye-{code:02x}")
            assert "server reference 'b.example'" in e["message"] and e["server_reference"] == "b.example"
        else:
            assert (e["code"], e["local"]) == (0x81, True), (code, e)
    named = {0x8E: "Session taken over", 0x95: "Packet too large", 0x9C: "Use another server"}
    for code, name in named.items():
        assert name in ev[code]["message"]


def ok_then(*sends: bytes, publish=False, close=False):
    """CONNACK ok, [read a PUBLISH], send `sends`, [close the connection]."""

    def run(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        if publish:
            c.expect(3)
        for s in sends:
            c.send(s)
        if close:
            c.half_close()

    return run


def connack_then_close(data: bytes):
    def run(c: Conn):
        c.expect(1)
        c.send(data)
        c.half_close()

    return run


def silent(c: Conn):
    c.expect(1)
    c.read()  # say nothing until the client gives up


# (name, server scenario, client steps, expected error fields, DISCONNECT reason the client must send or None)
PUB = ["publish", {"topic": TOPIC, "qos": 1, "service": False, **C}]
FLUSH = ["flush", {"timeout_ms": 3000, **C}]
CASES = [
    (
        "connack-bad-property-id",
        connack_then_close(b"\x20\x04\x00\x00\x01\x04"),
        [["connect", C]],
        {"code": 0x81, "text": "unknown property"},
        None,
    ),
    (
        "connack-topic-alias-property",
        connack_then_close(b"\x20\x06\x00\x00\x03\x23\x00\x01"),
        [["connect", C]],
        {"code": 0x81, "text": "not allowed in this packet"},
        None,
    ),
    (
        "connack-duplicate-property",
        connack_then_close(b"\x20\x09\x00\x00\x06\x21\x00\x01\x21\x00\x02"),
        [["connect", C]],
        {"code": 0x81, "text": "appears twice"},
        None,
    ),
    (
        "connack-truncated",
        connack_then_close(b"\x20\x0a\x00\x00"),
        [["connect", C]],
        {"type": "TransportError", "text": "connection closed by the broker"},
        None,
    ),
    (
        "connack-v311",
        connack_then_close(b"\x20\x02\x00\x01"),
        [["connect", C]],
        {"code": 0x81, "text": "truncated"},
        None,
    ),
    (
        "connack-oversized",
        connack_then_close(b"\x20\xff\xff\xff\x7f"),
        [["connect", C]],
        {"code": 0x95, "text": "268435460-byte packet"},
        None,
    ),
    (
        "connack-5-byte-length",
        connack_then_close(b"\x20\xff\xff\xff\xff\x01"),
        [["connect", C]],
        {"code": 0x81, "text": "longer than 4 bytes"},
        None,
    ),
    (
        "connack-session-present-on-clean-start",
        connack_then_close(b"\x20\x03\x01\x00\x00"),
        [["connect", C]],
        {"code": 0x82, "text": "Session Present with Clean Start"},
        None,
    ),
    (
        "session-present-without-local-state",
        connack_then_close(b"\x20\x03\x01\x00\x00"),
        [["connect", {"clean_start": False, **C}]],
        {"code": 0x82, "text": "holds no session state"},
        None,
    ),
    (
        "first-packet-not-connack",
        connack_then_close(b"\x40\x02\x00\x01"),
        [["connect", C]],
        {"code": 0x82, "text": "expected CONNACK"},
        None,
    ),
    ("no-connack", silent, [["connect", C]], {"type": "TransportError", "text": "no CONNACK within 3000 ms"}, None),
    (
        "puback-unknown-packet-id",
        ok_then(b"\x40\x02\x12\x34", publish=True),
        [["connect", C], PUB, FLUSH],
        {"code": 0x82, "text": "packet id 4660"},
        0x82,
    ),
    (
        "puback-packet-id-0",
        ok_then(b"\x40\x02\x00\x00", publish=True),
        [["connect", C], PUB, FLUSH],
        {"code": 0x81, "text": "packet identifier 0"},
        0x81,
    ),
    (
        "puback-bad-property",
        ok_then(b"\x40\x07\x00\x01\x00\x03\x1c\x00\x00", publish=True),
        [["connect", C], PUB, FLUSH],
        {"code": 0x81, "text": "not allowed"},
        0x81,
    ),
    (
        "puback-reserved-flags",
        ok_then(b"\x42\x02\x00\x01", publish=True),
        [["connect", C], PUB, FLUSH],
        {"code": 0x81, "text": "reserved flags"},
        0x81,
    ),
    (
        "puback-cut-by-close",
        ok_then(b"\x40\x02\x00", publish=True, close=True),
        [["connect", C], PUB, FLUSH],
        {"type": "TransportError", "text": "closed by the broker"},
        None,
    ),
    (
        "publish-from-server",
        ok_then(b"\x30\x07\x00\x01t\x00abc"),
        [["connect", C], ["service_for", {"ms": 3000}]],
        {"code": 0x82, "text": "unexpected PUBLISH"},
        0x82,
    ),
    (
        "auth-from-server",
        ok_then(b"\xf0\x00"),
        [["connect", C], ["service_for", {"ms": 3000}]],
        {"code": 0x82, "text": "unexpected AUTH"},
        0x82,
    ),
    (
        "pingresp-with-body",
        ok_then(b"\xd0\x01\x00"),
        [["connect", C], ["service_for", {"ms": 3000}]],
        {"code": 0x81, "text": "PINGRESP with flags or a body"},
        0x81,
    ),
    (
        "disconnect-with-session-expiry",
        ok_then(b"\xe0\x07\x8b\x05\x11\x00\x00\x00\x00"),
        [["connect", C], ["service_for", {"ms": 3000}]],
        {"code": 0x81, "text": "not allowed"},
        None,
    ),
    (
        "larger-than-client-maximum",
        ok_then(b"\xe0\xfc\x03" + b"\x00" * 508),
        [["connect", C], ["service_for", {"ms": 3000}]],
        {"code": 0x95, "text": "511-byte packet"},
        0x95,
    ),
    (
        "no-pingresp",
        ok_then(),
        [["connect", C], ["service_for", {"ms": 8000}]],
        {"code": 0x8D, "text": "link is dead"},
        None,
    ),
]


def test_malformed_and_unexpected_packets_are_named(tmp_path):
    steps = []
    for name, _, s, _, _ in CASES:
        steps += [["mark", {"name": name}]] + s + [["drop", {}]]
    server = FakeServer([c[1] for c in CASES])
    ev = drive(server, steps, tmp_path, client={"session_expiry": 0, "keepalive": 1})
    # pair each case's mark with the error that followed it
    by_case, current = {}, None
    for e in ev:
        if e["event"] == "mark":
            current = e["name"]
        elif e["event"] == "error":
            assert current not in by_case, (current, e)
            by_case[current] = e
    for (name, _, _, want, sent_reason), conn in zip(CASES, server.conns):
        e = by_case.get(name)
        assert e is not None, f"{name}: no error reported"
        assert e["type"] == want.get("type", "MQTTError"), (name, e)
        if "code" in want:
            assert e["code"] == want["code"] and e["local"], (name, e)
        assert want["text"] in e["message"], (name, e["message"])
        if sent_reason is not None:
            assert conn.received[-1] == (0xE0, bytes([sent_reason])), (name, conn.received[-1:])


def test_broker_limits_from_connack_are_honoured(tmp_path):
    def limits(c: Conn):
        c.expect(1)
        c.send(
            packet(
                0x20,
                b"\x00\x00"
                + props(
                    b"\x27\x00\x00\x00\x82", b"\x21\x00\x01", b"\x22\x00\x03", b"\x13\x00\x01", string(0x12, "auto-42")
                ),
            )
        )
        first = pid_of(c.expect(3))  # the small batch; the large one was refused by the client
        # Receive Maximum 1: nothing more comes until this is acknowledged; meanwhile the
        # client idles past Server Keep Alive (1 s, overriding its own 30 s) and pings
        assert c.read() == (0xC0, b""), c.received[-1]
        c.send(b"\xd0\x00")
        c.send(packet(0x40, first))
        c.send(packet(0x40, pid_of(c.expect(3))))

    def assigned(c: Conn):
        body = c.expect(1)
        assert body.endswith(b"\x00\x07auto-42"), body  # the reconnect uses the assigned identifier
        c.send(CONNACK_OK)

    server = FakeServer([limits, assigned])
    steps = [
        ["connect", {}],
        ["publish", {"topic": TOPIC, "qos": 1, "records": 100, **C}],
        ["publish", {"topic": TOPIC, "qos": 1, "records": 2, "service": False}],
        ["publish", {"topic": TOPIC, "qos": 1, "records": 2, "service": False}],
        ["flush", {"timeout_ms": 3000}],
        ["drop", {}],
        ["connect", {}],
    ]
    ev = drive(server, steps, tmp_path, client={"client_id": "", "session_expiry": 0})
    ca = of(ev, "connack")[0]
    assert (
        ca["max_packet_size"],
        ca["receive_max"],
        ca["topic_alias_max"],
        ca["server_keep_alive"],
        ca["assigned_client_id"],
        ca["limit"],
    ) == (130, 1, 3, 1, "auto-42", 1)
    (err,) = of(ev, "error")
    assert err["code"] == 0x95 and "Maximum Packet Size 130" in err["message"]
    assert [(p["result"], p["inflight"]) for p in of(ev, "published")] == [(1, 1), (2, 1)]
    assert all(p["size"] <= 130 for p in of(ev, "published"))
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, 0), (2, 0)]
    assert of(ev, "connack")[1]["client_id"] == "auto-42"
    assert server.conns[0].types() == [1, 3, 12, 3]


def test_qos2_session_resume_resends_pubrel_and_dup_publish(tmp_path):
    """QoS 2 state across a lost link: the message past PUBREC gets its PUBREL again,
    the one without PUBREC is published again with DUP=1 and the same packet id."""

    def first(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        p1, p2 = pid_of(c.expect(3)), pid_of(c.expect(3))
        assert (p1, p2) == (b"\x00\x01", b"\x00\x02")
        c.send(packet(0x50, p1))  # PUBREC for 1 only
        assert c.expect(6) == p1  # PUBREL 1
        c.sock.shutdown(socket.SHUT_WR)  # the link drops before PUBCOMP 1 and PUBREC 2

    def resumed(c: Conn):
        connect = c.expect(1)
        assert connect[7] & 0x02 == 0, "reconnect must not use Clean Start"
        c.send(b"\x20\x03\x01\x00\x00")  # Session Present
        assert c.expect(6) == b"\x00\x01"  # PUBREL 1 again
        first_byte, body = c.read()
        assert first_byte == 0x3C and pid_of(body) == b"\x00\x02", hex(first_byte)  # PUBLISH QoS 2, DUP
        c.send(packet(0x70, b"\x00\x01"))
        c.send(packet(0x50, b"\x00\x02"))
        assert c.expect(6) == b"\x00\x02"
        c.send(packet(0x70, b"\x00\x02"))

    server = FakeServer([first, resumed])
    steps = [
        ["connect", {}],
        ["publish", {"topic": TOPIC, "qos": 2, "batches": 2, "service": False}],
        ["service_for", {"ms": 3000, **C}],
        ["connect", {}],
        ["resend", {"topic": TOPIC, "qos": 2, "pid_to_batch": {"2": 1}}],
        ["flush", {"timeout_ms": 3000}],
        ["disconnect", {}],
    ]
    ev = drive(server, steps, tmp_path, client={"session_expiry": 300})
    (err,) = of(ev, "error")
    assert err["type"] == "TransportError" and err["step"] == "service_for"
    assert [c["session_present"] for c in of(ev, "connack")] == [False, True]
    assert of(ev, "connack")[1]["pending_resend"] == [2]
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, 0), (2, 0)]
    assert of(ev, "flushed")[0]["inflight"] == 0


def test_qos2_pubcomp_0x92_after_resent_pubrel_is_completion(tmp_path):
    """MQTT 5.0 §4.3.3 / §4.9: a broker that already completed a QoS 2 message answers
    the PUBREL resent after a session resume with PUBCOMP 0x92 (Packet Identifier not
    found). During recovery that means "already completed", not "refused": on_ack gets
    0x00 and the message counts as acknowledged. 0x92 on the first PUBREL of a live
    flow stays a refusal (test_every_ack_reason_code)."""

    def first(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        p1 = pid_of(c.expect(3))
        c.send(packet(0x50, p1))  # PUBREC
        assert c.expect(6) == p1  # PUBREL; the broker completes it, its PUBCOMP is lost
        c.sock.shutdown(socket.SHUT_WR)

    def resumed(c: Conn):
        c.expect(1)
        c.send(b"\x20\x03\x01\x00\x00")  # Session Present
        assert c.expect(6) == b"\x00\x01"  # PUBREL resent
        c.send(packet(0x70, b"\x00\x01\x92" + props(string(0x1F, "not found"))))
        p2 = pid_of(c.expect(3))  # a new message afterwards flows normally
        c.send(packet(0x50, p2))
        assert c.expect(6) == p2
        c.send(packet(0x70, p2))

    server = FakeServer([first, resumed])
    steps = [
        ["connect", {}],
        ["publish", {"topic": TOPIC, "qos": 2, "service": False}],
        ["service_for", {"ms": 3000, **C}],
        ["connect", {}],
        ["flush", {"timeout_ms": 3000}],
        ["publish", {"topic": TOPIC, "qos": 2, "service": False}],
        ["flush", {"timeout_ms": 3000}],
        ["disconnect", {}],
    ]
    ev = drive(server, steps, tmp_path, client={"session_expiry": 300})
    assert [c["session_present"] for c in of(ev, "connack")] == [False, True]
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, 0), (2, 0)]
    last = of(ev, "flushed")[-1]
    assert (last["inflight"], last["acked"], last["refused"]) == (0, 2, 0)


# -- a subscription (firmware/mqb_sub.py: the e2e ack topic, docs/e2e-ack.md) -------------------------

ACK_TOPIC = "mqbatch/device-1/ack"


def publish_in(qos: int, topic: str, payload: bytes, pid: int = 0, alias: int | None = None, dup=False) -> bytes:
    """A PUBLISH the server sends the client (Message Expiry 3600, optional Topic Alias)."""
    p = b"\x02\x00\x00\x0e\x10" + (b"\x23" + alias.to_bytes(2, "big") if alias is not None else b"")
    body = len(topic.encode()).to_bytes(2, "big") + topic.encode() + (pid.to_bytes(2, "big") if qos else b"")
    return packet(0x30 | (qos << 1) | (0x08 if dup else 0), body + props(p) + payload)


def suback(pid: bytes, code: int, reason: str | None = None) -> bytes:
    return packet(0x90, pid + props(*([string(0x1F, reason)] if reason else [])) + bytes([code]))


def expect_subscribe(c: Conn) -> bytes:
    """Read the SUBSCRIBE; check it byte by byte; return its packet id."""
    first, body = c.read()
    assert first == 0x82, hex(first)
    t = ACK_TOPIC.encode()
    assert body[2:] == b"\x00" + len(t).to_bytes(2, "big") + t + b"\x05", body  # no props, QoS 1 + No Local
    return body[:2]


def sub_drive(server, steps, tmp_path, client=None):
    """drive() with a subscription to ACK_TOPIC and a 900-byte receive buffer."""
    return drive(server, steps, tmp_path, client={"max_packet_size": 900, **(client or {})}, subscribe=ACK_TOPIC)


SERVE = ["service_for", {"ms": 1500, **C}]


def test_subscribe_suback_and_incoming_publish_with_topic_alias(tmp_path):
    """CONNECT advertises Topic Alias Maximum 1 and the receive buffer as Maximum Packet
    Size; SUBSCRIBE follows CONNACK; PUBLISHes at QoS 1 (PUBACKed with their packet id)
    and QoS 0, by name, setting alias 1, then by alias alone, reach the callback."""
    seen = {}

    def run(c: Conn):
        connect = c.expect(1)
        seen["connect"] = connect
        c.send(CONNACK_OK)
        pid = expect_subscribe(c)
        c.send(suback(pid, 0x01))
        c.send(publish_in(1, ACK_TOPIC, b"\x01" + bytes(12), pid=0x4242))
        assert c.expect(4) == b"\x42\x42"  # PUBACK, reason Success (short form)
        c.send(publish_in(1, ACK_TOPIC, b"two", pid=7, alias=1, dup=True))
        assert c.expect(4) == b"\x00\x07"
        c.send(publish_in(0, "", b"three", alias=1))  # the alias alone
        c.send(publish_in(1, "mqbatch/device-1/other", b"four", pid=8))
        assert c.expect(4) == b"\x00\x08"

    ev = sub_drive(FakeServer([run]), [["connect", C], SERVE, ["disconnect", C]], tmp_path)
    assert not of(ev, "error"), ev
    assert [(e["code"], e["reason"]) for e in of(ev, "suback")] == [(1, None)]
    assert [(m["topic"], bytes.fromhex(m["payload"])) for m in of(ev, "message")] == [
        (ACK_TOPIC, b"\x01" + bytes(12)),
        (ACK_TOPIC, b"two"),
        (ACK_TOPIC, b"three"),
        ("mqbatch/device-1/other", b"four"),
    ]
    connect = seen["connect"]
    assert b"\x27\x00\x00\x03\x84" in connect and b"\x22\x00\x01" in connect  # Max Packet Size 900, alias max 1


def test_refused_subscription_is_reported_and_the_link_stays(tmp_path):
    def run(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        c.send(suback(expect_subscribe(c), 0x87, "no ack topic for you"))
        pid = pid_of(c.expect(3))  # the client still publishes
        assert pid == b"\x00\x02"  # 1 went to the SUBSCRIBE
        c.send(packet(0x40, pid))

    ev = sub_drive(FakeServer([run]), [["connect", C], SERVE, PUB, FLUSH, ["disconnect", C]], tmp_path)
    assert not of(ev, "error"), ev
    assert [(e["code"], e["reason"]) for e in of(ev, "suback")] == [(0x87, "no ack topic for you")]
    assert [e["code"] for e in of(ev, "ack")] == [0]


def test_resumed_session_does_not_subscribe_again(tmp_path):
    def first(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        c.send(suback(expect_subscribe(c), 0x01))

    def resumed(c: Conn):
        c.expect(1)
        c.send(b"\x20\x03\x01\x00\x00")  # Session Present
        c.send(publish_in(1, ACK_TOPIC, b"queued", pid=3))
        assert c.expect(4) == b"\x00\x03"  # a PUBACK, no SUBSCRIBE before it

    def new_session(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        c.send(suback(expect_subscribe(c), 0x00))  # QoS 0 granted is accepted

    steps = [
        ["connect", C],
        SERVE,
        ["drop", {}],
        ["connect", C],
        SERVE,
        ["drop", {}],
        ["connect", {"clean_start": True, **C}],
        SERVE,
        ["disconnect", C],
    ]
    ev = sub_drive(FakeServer([first, resumed, new_session]), steps, tmp_path, client={"session_expiry": 600})
    assert not of(ev, "error"), ev
    assert [e["session_present"] for e in of(ev, "connack")] == [False, True, False]
    assert [e["code"] for e in of(ev, "suback")] == [1, 0]
    assert [bytes.fromhex(m["payload"]) for m in of(ev, "message")] == [b"queued"]


def _violation(*sends: bytes, suback_code=0x01, wrong_pid=False):
    def run(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        pid = expect_subscribe(c)
        c.send(suback(b"\x7f\x7f" if wrong_pid else pid, suback_code))
        for s in sends:
            c.send(s)

    return run


SUB_CASES = [
    (
        "alias-above-maximum",
        _violation(publish_in(1, ACK_TOPIC, b"x", pid=1, alias=2)),
        0x94,
        "Topic Alias Maximum is 1",
    ),
    ("alias-zero", _violation(publish_in(0, ACK_TOPIC, b"x", alias=0)), 0x94, "Topic Alias 0"),
    ("alias-unknown", _violation(publish_in(0, "", b"x", alias=1)), 0x94, "never set on this connection"),
    ("publish-qos2", _violation(publish_in(2, ACK_TOPIC, b"x", pid=1)), 0x82, "QoS 2 on a QoS 1 subscription"),
    ("publish-qos3", _violation(packet(0x36, b"\x00\x01a\x00\x01\x00")), 0x81, "reserved flags"),
    ("publish-wildcard-topic", _violation(publish_in(0, "a/+", b"x")), 0x81, "not allowed by the specification"),
    ("publish-bad-property", _violation(packet(0x30, b"\x00\x01a\x03\x21\x00\x01")), 0x81, "not allowed in this"),
    ("suback-wrong-pid", _violation(wrong_pid=True), 0x82, "not waiting for it"),
    ("suback-granted-qos2", _violation(suback_code=0x02), 0x82, "granted QoS 2"),
    ("suback-bad-code", _violation(suback_code=0x05), 0x81, "reason code not defined"),
    ("suback-twice", _violation(suback(b"\x00\x01", 0x01)), 0x82, "not waiting for it"),
]


@pytest.mark.parametrize("name, scenario, code, text", SUB_CASES, ids=[c[0] for c in SUB_CASES])
def test_subscription_protocol_violations_end_the_link(name, scenario, code, text, tmp_path):
    server = FakeServer([scenario])
    ev = sub_drive(server, [["connect", C], ["service_for", {"ms": 3000}]], tmp_path)
    (err,) = of(ev, "error")
    assert (err["code"], err["local"]) == (code, True) and text in err["message"], err
    assert server.conns[0].received[-1] == (0xE0, bytes([code]))  # DISCONNECT with that reason


def test_publish_without_a_subscription_is_still_a_protocol_error(tmp_path):
    server = FakeServer([ok_then(publish_in(1, ACK_TOPIC, b"x", pid=1))])
    ev = drive(server, [["connect", C], ["service_for", {"ms": 3000}]], tmp_path)
    (err,) = of(ev, "error")
    assert err["code"] == 0x82 and "only publishes" in err["message"], err
