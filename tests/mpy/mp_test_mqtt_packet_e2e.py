# MicroPython tests of firmware/mqb_packet_e2e.py (and the e2e parts of mqb_packet):
# exact SUBSCRIBE bytes, every SUBACK reason code, incoming PUBLISH at QoS 0/1 with
# a topic name or a Topic Alias, malformed inputs named, the batch-seq property, the
# CONNECT's Topic Alias Maximum, and no allocation on the receive path.
from array import array
import mqb_packet as P
import mqb_packet_build as B
import mqb_packet_e2e as E
from mqb_codec import BatchEncoder
from outbox_util import assert_no_alloc, str_raises
from mp_test_mqtt_packet import _props, _s, _u16, _u32, _parse_publish

ACK_TOPIC = b"mqbatch/dev-001/ack"


def test_subscribe_packet_exact_bytes():
    buf = bytearray(64)
    n = E.subscribe_packet(buf, 7, ACK_TOPIC, 1 | 0x04)     # QoS 1, No Local
    expect = b"\x82\x19\x00\x07\x00\x00\x13" + ACK_TOPIC + b"\x05"
    assert bytes(buf[:n]) == expect, bytes(buf[:n])
    assert "reserved bits" in str_raises(ValueError, E.subscribe_packet, buf, 7, ACK_TOPIC, 0x40)
    assert "QoS 3" in str_raises(ValueError, E.subscribe_packet, buf, 7, ACK_TOPIC, 3)
    assert "Retain Handling 3" in str_raises(ValueError, E.subscribe_packet, buf, 7, ACK_TOPIC, 0x31)
    assert "packet identifier" in str_raises(ValueError, E.subscribe_packet, buf, 0, ACK_TOPIC, 1)
    assert "1..65535 bytes" in str_raises(ValueError, E.subscribe_packet, buf, 1, b"", 1)
    assert "does not fit" in str_raises(ValueError, E.subscribe_packet, bytearray(20), 1, ACK_TOPIC, 1)


def test_connect_packet_topic_alias_maximum():
    pkt = B.connect_packet(b"d", 0, False, 0, 65535, 900, topic_alias_max=1)
    assert bytes(pkt) == b"\x10\x16\x00\x04MQTT\x05\x00\x00\x00\x08\x27\x00\x00\x03\x84\x22\x00\x01\x00\x01d", bytes(pkt)
    assert "Topic Alias Maximum" in str_raises(ValueError, B.connect_packet, b"d", 0, False, 0, 4, 900, None, None,
                                               None, 70000)


def test_every_suback_reason_code():
    granted = 0
    for code in range(256):
        body = bytearray(b"\x00\x09" + _props(_s(0x1F, b"why")) + bytes((code,)))
        r = E.parse_suback(body, 0, len(body))
        if code in (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2):
            assert r == code, (code, r)
            assert P.prop_string(body, 3, len(body) - 1, P.P_REASON_STRING) == "why"
            assert P.reason_name(code) != "unknown reason code"
            granted += code < 0x80
        else:
            assert r == P.E_BAD_REASON, (code, r)
    assert granted == 3
    body = bytearray(b"\x00\x09\x00\x01")
    assert E.parse_suback(body, 0, 4) == 1


def test_malformed_suback_is_named():
    cases = (
        (b"\x00\x09", P.E_TRUNCATED),                       # no property length, no code
        (b"\x00\x00\x00\x00", P.E_BAD_PACKET_ID),
        (b"\x00\x09\x00", P.E_TRUNCATED),                   # no reason code
        (b"\x00\x09\x00\x00\x01", P.E_TRAILING),            # two codes for one filter
        (b"\x00\x09\x05\x1f\x00\x09ab\x00", P.E_TRUNCATED),  # property longer than its block
        (b"\x00\x09\x03\x21\x00\x01\x00", P.E_BAD_PROPERTY),  # Receive Maximum is not a SUBACK property
        (b"\x00\x09\x08\x1f\x00\x01a\x1f\x00\x01b\x00", P.E_DUP_PROPERTY),
        (b"\x00\x09\xff\xff\xff\xff\x00", P.E_BAD_VALUE),   # property length VBI of 5 bytes
    )
    for body, want in cases:
        assert E.parse_suback(bytearray(body), 0, len(body)) == want, (body, E.parse_suback(bytearray(body), 0, len(body)))


def _publish_body(topic, pid, props, payload):
    return topic_field(topic) + (pid.to_bytes(2, "big") if pid is not None else b"") + _props(*props) + payload


def topic_field(topic):
    return len(topic).to_bytes(2, "big") + topic


def test_incoming_publish_qos0_qos1_topic_and_alias():
    out = array("i", [0] * 5)
    payload = b"\x01" + b"\x00" * 12
    # QoS 1, topic name, Message Expiry, Topic Alias 1, a User Property, a Subscription Identifier twice
    body = bytearray(_publish_body(ACK_TOPIC, 0x1234, (_u32(0x02, 3600), _u16(0x23, 1), b"\x26\x00\x01k\x00\x01v",
                                                       b"\x0b\x05", b"\x0b\x06"), payload))
    assert E.parse_publish(0x32, body, 0, len(body), out) == 1
    assert bytes(body[out[0]:out[0] + out[1]]) == ACK_TOPIC        # the topic name, in place
    assert (out[2], out[3]) == (0x1234, 1)                           # packet id, Topic Alias
    assert bytes(body[out[4]:]) == payload
    # QoS 0, DUP 0, empty name with alias 1, no properties but the alias
    body = bytearray(_publish_body(b"", None, (_u16(0x23, 1),), payload))
    assert E.parse_publish(0x30, body, 0, len(body), out) == 0
    assert (out[1], out[2], out[3]) == (0, 0, 1)
    assert bytes(body[out[4]:]) == payload
    # retained, DUP at QoS 1, no properties, empty payload
    body = bytearray(_publish_body(ACK_TOPIC, 1, (), b""))
    assert E.parse_publish(0x3B, body, 0, len(body), out) == 1 and out[4] == len(body)
    assert out[3] == -1
    # QoS 2 is parsed (the client refuses it: it subscribed at QoS 1)
    assert E.parse_publish(0x34, body, 0, len(body), out) == 2
    # alias 0 is reported as such (the client answers 0x94)
    body = bytearray(_publish_body(ACK_TOPIC, 1, (_u16(0x23, 0),), b""))
    assert E.parse_publish(0x32, body, 0, len(body), out) == 1 and out[3] == 0


def test_malformed_incoming_publish_is_named():
    t = ACK_TOPIC
    cases = (
        (0x36, _publish_body(t, 1, (), b"x"), P.E_BAD_FLAGS),           # QoS 3
        (0x38, _publish_body(t, None, (), b"x"), P.E_BAD_FLAGS),        # DUP at QoS 0
        (0x32, b"\x00", P.E_TRUNCATED),
        (0x32, b"\x00\x30abc", P.E_TRUNCATED),                          # topic longer than the packet
        (0x32, topic_field(t) + b"\x00", P.E_TRUNCATED),                # packet id cut
        (0x32, _publish_body(t, 0, (), b"x"), P.E_BAD_PACKET_ID),
        (0x30, topic_field(t), P.E_TRUNCATED),                          # no property length
        (0x30, _publish_body(b"a/+/b", None, (), b""), P.E_BAD_VALUE),  # wildcard in a topic name
        (0x30, _publish_body(b"a/#", None, (), b""), P.E_BAD_VALUE),
        (0x30, _publish_body(b"a\x00b", None, (), b""), P.E_BAD_VALUE),
        (0x30, _publish_body(b"", None, (), b"x"), P.E_BAD_VALUE),      # empty name, no alias
        (0x30, _publish_body(t, None, (_u16(0x21, 5),), b""), P.E_BAD_PROPERTY),  # Receive Maximum
        (0x30, _publish_body(t, None, (_u16(0x23, 1), _u16(0x23, 2)), b""), P.E_DUP_PROPERTY),
        (0x30, _publish_body(t, None, (b"\x01\x02",), b""), P.E_BAD_VALUE),  # Payload Format 2
        (0x30, _publish_body(t, None, (b"\x0b\x00",), b""), P.E_BAD_VALUE),  # Subscription Identifier 0
        (0x30, topic_field(t) + b"\x05\x02\x00\x00", P.E_TRUNCATED),    # property block past the end
    )
    out = array("i", [0] * 5)
    for first, body, want in cases:
        b = bytearray(body)
        r = E.parse_publish(first, b, 0, len(b), out)
        assert r == want, (first, body, r, want)


def test_batch_seq_property_in_the_publish_header():
    enc = BatchEncoder(bytearray(512 + 128), headroom=128)
    for i in range(3):
        enc.add(("rec%d" % i).encode())
    topic = b"mqbatch/dev-001/telemetry"
    seq = E.BatchSeq()
    try:
        for boot, first, last in ((1, 0, 2), (4294967295, 4294967293, 4294967295), (12, 100, 102)):
            seq.set(boot, first, last)
            B.batch_seq = seq
            start = B.write_publish_header(enc.buf, enc.headroom, 2, topic, len(topic), 9, 0, None, None, None, enc)
            users = _parse_publish(enc.buf, start, enc.end)[4]
            value = "%d:%d-%d" % (boot, first, last)
            assert (b"batch-seq", value.encode()) in users, users
            assert len(seq) == 14 + len(value) <= 46
            assert B.publish_props_len(1, 0, None, None, None) == 19 + 16 + len(seq)   # + batch-format, batch-size
        seq.set(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)        # the largest (mqb_e2e sets it for a budget)
        assert len(seq) == 46
        B.batch_seq = None
        start = B.write_publish_header(enc.buf, enc.headroom, 2, topic, len(topic), 9, 0, None, None, None, enc)
        assert not [k for k, v in _parse_publish(enc.buf, start, enc.end)[4] if k == b"batch-seq"]
    finally:
        B.batch_seq = None
    assert "batch-seq" in str_raises(ValueError, seq.set, 1, 5, 4)
    assert "batch-seq" in str_raises(ValueError, seq.set, -1, 0, 0)


def test_receive_path_allocates_nothing():
    out = array("i", [0] * 5)
    pub = bytearray(_publish_body(ACK_TOPIC, 0x1234, (_u32(0x02, 3600), _u16(0x23, 1)), b"\x01" + b"\x00" * 12))
    suback = bytearray(b"\x00\x09\x00\x01")
    sub = bytearray(64)
    enc = BatchEncoder(bytearray(512 + 128), headroom=128)
    enc.add(b"0123456789")
    topic = b"mqbatch/dev-001/telemetry"
    seq = E.BatchSeq()
    # one closed-over tuple: a closure over 5+ cells allocates its argument array per call
    st = (out, pub, suback, sub, enc, topic, seq)

    def one(i):
        out, pub, suback, sub, enc, topic, seq = st
        assert E.parse_publish(0x32, pub, 0, len(pub), out) == 1     # QoS 1: parsed, not refused
        assert E.parse_suback(suback, 0, 4) == 1                    # granted QoS 1
        E.subscribe_packet(sub, (i & 0xFFF) + 1, ACK_TOPIC, 5)
        seq.set(3, i, i + 9)
        B.write_publish_header(enc.buf, enc.headroom, 2, topic, len(topic), (i & 0xFFF) + 1, 0, None, None, None, enc)

    B.batch_seq = seq
    try:
        assert_no_alloc(one)
    finally:
        B.batch_seq = None
