"""The MQTT 5.0 rows of the requirement matrix (a publisher's obligations), each with the OASIS
normative statement ids it checks: (id, section, text, how, session rule ids, statements)."""

from __future__ import annotations

ROWS = [
    (
        "MQTT-VERSION",
        "MQTT 3.1.2.2",
        "The client speaks MQTT 5: CONNECT protocol name MQTT, version 5.",
        "proxy: an MQTT 3.1.1 (or other) CONNECT is named, the rest of the connection relayed",
        ["MQTT-VERSION"],
        ("MQTT-3.1.2-1", "MQTT-3.1.2-2"),
    ),
    (
        "MQTT-FIRST-CONNECT",
        "MQTT 3.1",
        "The first client packet of a connection is CONNECT, and it is sent only once.",
        "proxy, every connection",
        ["MQTT-FIRST-CONNECT"],
        ("MQTT-3.1.0-1", "MQTT-3.1.0-2"),
    ),
    (
        "MQTT-FIXED-HEADER",
        "MQTT 2.1",
        "Well-formed fixed header: packet type, reserved flags, no QoS 3, no DUP on QoS 0; CONNECT flags.",
        "proxy, every packet",
        ["MQTT-FIXED-HEADER"],
        ("MQTT-2.1.3-1", "MQTT-3.3.1-2", "MQTT-3.3.1-4", "MQTT-3.6.1-1", "MQTT-3.14.1-1", "MQTT-3.1.2-3")
        + ("MQTT-3.1.2-11", "MQTT-3.1.2-12", "MQTT-3.1.2-13", "MQTT-4.3.1-1"),
    ),
    (
        "MQTT-REMAINING-LENGTH",
        "MQTT 2.1.4, 1.5.5",
        "Every packet parses to its end: Remaining Length and VBIs minimal and at most 4 bytes, every field "
        "present (CONNECT payload in order, user name / password as flagged).",
        "proxy, every packet and the end of every stream",
        ["MQTT-VBI", "MQTT-MALFORMED"],
        ("MQTT-1.5.5-1", "MQTT-3.1.2-9", "MQTT-3.1.2-16", "MQTT-3.1.2-17", "MQTT-3.1.2-18")
        + ("MQTT-3.1.2-19", "MQTT-3.1.3-1", "MQTT-3.1.3-3", "MQTT-3.3.2-1", "MQTT-3.3.2-2"),
    ),
    (
        "MQTT-UTF8",
        "MQTT 1.5.4",
        "UTF-8 strings valid, without U+0000.",
        "proxy, every string field",
        ["MQTT-UTF8"],
        ("MQTT-1.5.4-1", "MQTT-1.5.4-2", "MQTT-3.1.3-4", "MQTT-3.1.3-11", "MQTT-3.1.3-12")
        + ("MQTT-3.3.2-13", "MQTT-3.3.2-19", "MQTT-4.7.3-2"),
    ),
    (
        "MQTT-PROPERTIES",
        "MQTT 2.2.2",
        "Only known properties, only those allowed for the packet type; single-valued ones at most once.",
        "proxy, every property (an unknown identifier ends the packet's parse and is named)",
        ["MQTT-PROP-ALLOWED", "MQTT-PROP-REPEAT"],
        (),
    ),
    (
        "MQTT-REASON-CODE",
        "MQTT 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.14.2.1",
        "Acknowledgements and DISCONNECT carry a Reason Code defined for that packet.",
        "proxy, every PUBACK/PUBREC/PUBREL/PUBCOMP/DISCONNECT/AUTH",
        ["MQTT-REASON-CODE"],
        ("MQTT-3.4.2-1", "MQTT-3.5.2-1", "MQTT-3.6.2-1", "MQTT-3.7.2-1", "MQTT-3.14.2-1"),
    ),
    (
        "MQTT-PACKET-ID",
        "MQTT 2.2.1",
        "Packet Identifier non-zero, present only at QoS > 0, a new message never on an id still open.",
        "proxy",
        ["MQTT-PID", "MQTT-PID-REUSE"],
        ("MQTT-2.2.1-2", "MQTT-2.2.1-3", "MQTT-4.3.2-1", "MQTT-4.3.3-1", "MQTT-4.3.2-3", "MQTT-4.3.3-3"),
    ),
    (
        "MQTT-MAX-PACKET-SIZE",
        "MQTT 3.2.2.3.6",
        "No packet above the server's Maximum Packet Size.",
        "proxy, exact size (a header declaring more is named before the bytes arrive); scenarios "
        "max_packet_size 120, 128, 200, 600, 2000",
        ["MQTT-MAX-PACKET-SIZE"],
        ("MQTT-3.2.2-15", "MQTT-3.6.2-2", "MQTT-3.6.2-3", "MQTT-3.14.2-3", "MQTT-3.14.2-4"),
    ),
    (
        "MQTT-TOPIC-ALIAS",
        "MQTT 3.3.2.3.4",
        "Topic Alias never above the server's Topic Alias Maximum (0 or absent: none), never used before "
        "it was defined on this connection.",
        "proxy; scenarios max_topic_alias 0, 2, 10",
        ["MQTT-TOPIC-ALIAS"],
        ("MQTT-3.3.2-9", "MQTT-3.2.2-17", "MQTT-3.2.2-18"),
    ),
    (
        "MQTT-TOPIC-ALIAS-0",
        "MQTT 3.3.2.3.4",
        "No Topic Alias of value 0.",
        "proxy, every client PUBLISH",
        ["MQTT-TOPIC-ALIAS-0"],
        ("MQTT-3.3.2-8",),
    ),
    (
        "MQTT-SUB-ID",
        "MQTT 3.3.4",
        "No Subscription Identifier in a client PUBLISH.",
        "proxy, every client PUBLISH",
        ["MQTT-SUB-ID"],
        ("MQTT-3.3.4-6",),
    ),
    (
        "MQTT-RECEIVE-MAX",
        "MQTT 3.3.4, 4.9",
        "Unacknowledged QoS 1/2 PUBLISHes never above the server's Receive Maximum.",
        "proxy; scenarios inflight-1/2/20, qos2-live, keepalive-1: acknowledgements withheld until the "
        "quota is used up and 0.4 s more, so a client that ignores the limit sends one too many",
        ["MQTT-RECEIVE-MAX"],
        ("MQTT-3.3.4-7", "MQTT-4.9.0-1", "MQTT-4.9.0-2"),
    ),
    (
        "MQTT-DUP",
        "MQTT 4.3, 4.4",
        "DUP=0 on a first transmission; DUP=1 only on the resend, after a Session Present resume, of a "
        "message left open.",
        "proxy; scenarios resume-dup, qos2-recovery",
        ["MQTT-DUP"],
        ("MQTT-4.3.2-2", "MQTT-4.3.3-2"),
    ),
    (
        "MQTT-DUP-RESEND",
        "MQTT 3.3.1.1",
        "A resent PUBLISH (same id, same message) has DUP=1.",
        "proxy; scenarios resume-dup, resume-order, qos2-recovery",
        ["MQTT-DUP-RESEND"],
        ("MQTT-3.3.1-1",),
    ),
    (
        "MQTT-RESEND",
        "MQTT 4.4",
        "After a Session Present resume the client resends every PUBLISH and PUBREL left open, with their "
        "original ids, before it ends the connection.",
        "proxy; scenarios resume-dup, resume-order, qos2-recovery",
        ["MQTT-RESEND"],
        ("MQTT-4.4.0-1", "MQTT-3.1.2-23", "MQTT-3.1.3-2"),
    ),
    (
        "MQTT-RESEND-ORDER",
        "MQTT 4.6",
        "Resent PUBLISHes go in the order of their first transmission.",
        "proxy; scenario resume-order (several messages open when the link is lost)",
        ["MQTT-RESEND-ORDER"],
        ("MQTT-4.6.0-1",),
    ),
    (
        "MQTT-SESSION",
        "MQTT 3.1.2.4, 3.2.2.1.1",
        "With Clean Start 1 or Session Present 0 the old session is discarded: none of its messages are "
        "resent (DUP) or released (PUBREL) into the new one.",
        "proxy: ids open when a connection ended, against the next connection of that client id; scenario "
        "session-lost (the reconnect reaches the broker with Clean Start 1: Session Present 0)",
        ["MQTT-SESSION"],
        ("MQTT-3.1.2-4", "MQTT-3.2.2-5"),
    ),
    (
        "MQTT-PUBREL",
        "MQTT 4.3.3",
        "QoS 2: a PUBREL follows each PUBREC (< 0x80) in a live session; the PUBLISH is not resent after it.",
        "proxy: a client that ends its connection with a PUBREC >= 3 s unanswered; scenarios qos2-live "
        "(PUBRECs withheld, then released), qos2-recovery",
        ["MQTT-PUBREL"],
        ("MQTT-4.3.3-4", "MQTT-4.3.3-5", "MQTT-4.3.3-6"),
    ),
    (
        "MQTT-KEEPALIVE",
        "MQTT 3.1.2.10, 3.2.2.3.14",
        "The client sends a packet (PINGREQ if nothing else) within the Keep Alive in force: its own, or "
        "the Server Keep Alive of the CONNACK.",
        "proxy: every gap between client packets, and to the end of the connection, against 1.5 x the "
        "Keep Alive in force (the server's allowance); scenario keepalive-1 (Keep Alive 1 s, acknowledgements withheld 1.7 s)",
        ["MQTT-KEEPALIVE"],
        ("MQTT-3.1.2-20", "MQTT-3.1.2-21", "MQTT-3.2.2-21"),
    ),
    (
        "MQTT-MAX-QOS",
        "MQTT 3.2.2.3.4",
        "No PUBLISH above the server's Maximum QoS.",
        "proxy; scenarios max_qos 0 and 1",
        ["MQTT-MAX-QOS"],
        ("MQTT-3.2.2-11",),
    ),
    (
        "MQTT-RETAIN",
        "MQTT 3.2.2.3.5",
        "No RETAIN=1 when the server has Retain Available 0.",
        "proxy; scenario retain_available false; PASS needs a publisher that retains when it may "
        "(a retained PUBLISH or Will) and so was tempted",
        ["MQTT-RETAIN"],
        ("MQTT-3.2.2-14",),
    ),
    (
        "MQTT-AFTER-DISCONNECT",
        "MQTT 3.14.4",
        "Nothing sent after the client's DISCONNECT.",
        "proxy",
        ["MQTT-AFTER-DISCONNECT"],
        ("MQTT-3.14.4-1",),
    ),
]


def rows(req_class) -> list:
    return [req_class(rid, sec, "MUST", text, how, ("pub", rules), stmts) for rid, sec, text, how, rules, stmts in ROWS]
