"""The client rules added to the session checker (mqbatch.conformance.session), each on packets
written here byte by byte: one broken input per rule shows it can fail, one good one that it
does not fail a conforming client. Also the Maximum Packet Size probe's CONNACK rewrite."""

from __future__ import annotations

from mqbatch.conformance.probe import MaxPacketProbe, _max_packet_offset
from mqbatch.conformance.session import C2S, S2C, Checker

H = bytes.fromhex
CONNECT = H("10 12 0004 4d515454 05 02 003c 03 21 0014 0002 6331")  # clean start, keep alive 60
CONNECT_RESUME = H("10 12 0004 4d515454 05 00 003c 03 21 0014 0002 6331")
CONNACK = H("20 03 00 00 00")
CONNACK_PRESENT = H("20 03 01 00 00")
CONNACK_NO_RETAIN = H("20 05 00 00 02 25 00")


def pub(pid: int, flags: int = 0x32, payload: bytes = b"\x01A", props: bytes = b"") -> bytes:
    body = b"\x00\x03t/x" + (pid.to_bytes(2, "big") if flags & 6 else b"") + bytes([len(props)]) + props + payload
    return bytes([flags, len(body)]) + body


def run(*steps, t_step: float = 0.1, close_at: float | None = None, by_client: bool = False):
    ck = Checker(["b/#"])
    conn, n, t = ck.connection(0), 0, 0.0
    for d, raw in steps:
        if raw == "new":
            conn.close(t)
            n += 1
            conn = ck.connection(n)
            continue
        if d == "wait":
            t += raw
            continue
        t += t_step
        conn.feed(d, raw, t)
    conn.close(close_at if close_at is not None else t, by_client=by_client)
    return ck


def rules(ck) -> list[str]:
    return [v.rule for v in ck.violations]


def test_retain_is_only_exercised_for_a_publisher_that_retains():
    never = run((C2S, CONNECT), (S2C, CONNACK_NO_RETAIN), (C2S, pub(1)))
    assert rules(never) == [] and never.applied.get((C2S, "MQTT-RETAIN"), 0) == 0  # NOT TESTED, not PASS
    will_retain = H("10 18 0004 4d515454 05 26 003c 00 0002 6331 00 0001 77 0003 6f6666")  # Will QoS 0, Retain
    tempted = run((C2S, will_retain), (S2C, CONNACK_NO_RETAIN), (C2S, pub(1)))
    assert rules(tempted) == [] and tempted.applied[(C2S, "MQTT-RETAIN")] == 1
    assert rules(run((C2S, CONNECT), (S2C, CONNACK_NO_RETAIN), (C2S, pub(1, flags=0x33)))) == ["MQTT-RETAIN"]


def test_keep_alive():
    ka1 = H("10 12 0004 4d515454 05 02 0001 03 21 0014 0002 6331")  # Keep Alive 1 s
    assert rules(run((C2S, ka1), (S2C, CONNACK), (C2S, H("c0 00")), (C2S, H("e0 00")))) == []
    assert rules(run((C2S, ka1), (S2C, CONNACK), ("wait", 1.6), (C2S, H("c0 00")))) == ["MQTT-KEEPALIVE"]
    assert rules(run((C2S, ka1), (S2C, CONNACK), close_at=5.0)) == ["MQTT-KEEPALIVE"]  # silent to the end
    server_ka = H("20 06 00 00 03 13 0001")  # Server Keep Alive 1 s overrides the client's 60
    assert rules(run((C2S, CONNECT), (S2C, server_ka), ("wait", 1.6), (C2S, H("c0 00")))) == ["MQTT-KEEPALIVE"]


def test_pubrel_follows_pubrec():
    q2 = [(C2S, CONNECT), (S2C, CONNACK), (C2S, pub(1, flags=0x34)), (S2C, H("50 02 0001"))]
    assert rules(run(*q2, (C2S, H("62 02 0001")), (S2C, H("70 02 0001")), (C2S, H("e0 00")))) == []
    assert rules(run(*q2, ("wait", 3.5), (C2S, H("e0 00")))) == ["MQTT-PUBREL"]
    assert rules(run(*q2, ("wait", 3.5), close_at=10.0, by_client=True)) == ["MQTT-PUBREL"]
    # the PUBLISH resent after its PUBREL
    again = run(*q2, (C2S, H("62 02 0001")), (C2S, pub(1, flags=0x3C)))
    assert rules(again) == ["MQTT-PUBREL"]


def test_resend_order_and_a_discarded_session():
    left = [(C2S, CONNECT), (S2C, CONNACK), (C2S, pub(1, payload=b"\x01a")), (C2S, pub(2, payload=b"\x01b"))]
    resume = [(None, "new"), (C2S, CONNECT_RESUME), (S2C, CONNACK_PRESENT)]
    in_order = run(*left, *resume, (C2S, pub(1, 0x3A, b"\x01a")), (C2S, pub(2, 0x3A, b"\x01b")), (C2S, H("e0 00")))
    assert rules(in_order) == []
    reversed_ = run(*left, *resume, (C2S, pub(2, 0x3A, b"\x01b")), (C2S, pub(1, 0x3A, b"\x01a")))
    assert rules(reversed_) == ["MQTT-RESEND-ORDER"]
    no_dup = run(*left, *resume, (C2S, pub(1, 0x32, b"\x01a")), (C2S, pub(2, 0x3A, b"\x01b")))
    assert rules(no_dup) == ["MQTT-DUP-RESEND"]
    other = run(*left, *resume, (C2S, pub(1, 0x3A, b"\x01z")), (C2S, pub(2, 0x3A, b"\x01b")))
    assert rules(other) == ["MQTT-RESEND"]  # DUP on an open id, another message
    clean = [(None, "new"), (C2S, CONNECT), (S2C, CONNACK)]  # Clean Start 1: the old session is gone
    assert rules(run(*left, *clean, (C2S, pub(1, 0x3A, b"\x01a")))) == ["MQTT-SESSION"]


def test_client_packet_rules():
    ok = [(C2S, CONNECT), (S2C, CONNACK)]
    assert rules(run(*ok, (C2S, pub(1, props=H("0b 01"))))) == ["MQTT-SUB-ID"]
    assert rules(run(*ok, (C2S, H("e0 01 05")))) == ["MQTT-REASON-CODE"]
    assert rules(run(*ok, (C2S, H("62 03 0001 10")))) == ["MQTT-REASON-CODE"]  # PUBREL 0x10
    assert rules(run((C2S, H("c0 00")), *ok)) == ["MQTT-FIRST-CONNECT"]
    assert rules(run(*ok, (C2S, CONNECT))) == ["MQTT-FIRST-CONNECT"]
    v311 = run((C2S, H("10 10 0004 4d515454 04 02 003c 0004 756d7174")))
    assert rules(v311) == ["MQTT-VERSION"] and "MQTT 3.1.1" in v311.violations[0].text


def test_max_packet_probe_rewrites_the_connack():
    connack = H("20 0c 00 00 09 21 0014 27 0000012c 25 01")  # Receive Maximum 20, Maximum Packet Size 300
    assert _max_packet_offset(connack) == 9
    pr = MaxPacketProbe()
    assert pr.packet(0, S2C, connack) == (connack, False)  # the first connection: the broker's own 300
    for size in (281, 281, 266):
        pr.packet(0, C2S, bytes([0x32]) + bytes(size - 1))
    assert pr.packet(0, S2C, H("40 02 0001")) == (H("40 02 0001"), True)  # cut after a full batch's ack
    told = [int.from_bytes(pr.packet(n, S2C, connack)[0][9:13], "big") for n in (1, 2)]
    assert told == [280, 281]  # P - 1, then P, for the most frequent size 281


def test_lose_sessions_sets_clean_start_on_the_connect():
    from mqbatch.conformance.proxy import _clean_start

    assert _clean_start(CONNECT_RESUME) == CONNECT and _clean_start(CONNECT) == CONNECT
