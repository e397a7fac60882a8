# MicroPython tests of firmware/mqb_packet.py: exact bytes and sizes of what the
# client builds, and what the parsers say about every reason code and about
# malformed CONNACK / PUBACK / PUBREC / PUBCOMP / DISCONNECT packets.
import mqb_packet as P
import mqb_packet_build as B
from mqb_codec import BatchEncoder, vbi_read, vbi_size
from outbox_util import alloc_over, assert_no_alloc, str_raises

ALL_PROPS = tuple(range(0x2B))


def _props(*items):
    """Property block: VBI length + the concatenated items (bytes)."""
    body = b"".join(items)
    n = len(body)
    out = bytearray(vbi_size(n))
    end = 0
    while True:
        b = n & 0x7F
        n >>= 7
        out[end] = b | (0x80 if n else 0)
        end += 1
        if not n:
            break
    return bytes(out) + body


def _s(pid, text):
    return bytes((pid, len(text) >> 8, len(text) & 0xFF)) + text


def _u16(pid, v):
    return bytes((pid, v >> 8, v & 0xFF))


def _u32(pid, v):
    return bytes((pid, v >> 24, (v >> 16) & 0xFF, (v >> 8) & 0xFF, v & 0xFF))


def test_connect_packet_exact_bytes():
    pkt = B.connect_packet(b"dev", 30, True, 3600, 4, 512, b"u", b"p")
    expect = (b"\x10\x26" + b"\x00\x04MQTT\x05\xc2\x00\x1e"
              + b"\x10" + b"\x11\x00\x00\x0e\x10" + b"\x21\x00\x04" + b"\x27\x00\x00\x02\x00" + b"\x22\x00\x00"
              + b"\x00\x03dev" + b"\x00\x01u" + b"\x00\x01p")
    assert bytes(pkt) == expect, bytes(pkt)
    # no session expiry, default receive maximum, no credentials, not clean: flags 0
    pkt = B.connect_packet(b"d", 0, False, 0, 65535, 1024)
    assert bytes(pkt) == b"\x10\x16\x00\x04MQTT\x05\x00\x00\x00\x08\x27\x00\x00\x04\x00\x22\x00\x00\x00\x01d", bytes(pkt)


def test_connect_packet_with_will_properties():
    will = B.Will(b"mqbatch/d/status", b"offline", qos=1, retain=True, delay=5, expiry=600,
                  content_type=b"text/plain", payload_format=1)
    pkt = B.connect_packet(b"d", 60, True, 0, 4, 512, will=will)
    assert pkt[9] == 0x02 | 0x04 | (1 << 3) | 0x20  # clean start, will, will QoS 1, will retain
    tail = (_props(_u32(0x18, 5), b"\x01\x01", _u32(0x02, 600), _s(0x03, b"text/plain"))
            + b"\x00\x10mqbatch/d/status" + b"\x00\x07offline")
    assert bytes(pkt).endswith(tail), bytes(pkt)
    assert vbi_read(pkt, 1, len(pkt)) == len(pkt) - 2
    assert "Will QoS" in str_raises(ValueError, B.Will, b"t", b"x", 3)
    assert "keep alive" in str_raises(ValueError, B.connect_packet, b"d", 70000, True, 0, 4, 512)
    assert "Receive Maximum" in str_raises(ValueError, B.connect_packet, b"d", 60, True, 0, 0, 512)


def _parse_publish(buf, start, end):
    """Independent decoder of the PUBLISH the client wrote (test oracle)."""
    first = buf[start]
    rem = vbi_read(buf, start + 1, end)
    p = start + 1 + vbi_size(rem)
    assert p + rem == end, (p, rem, end)
    tlen = (buf[p] << 8) | buf[p + 1]
    topic = bytes(buf[p + 2:p + 2 + tlen])
    p += 2 + tlen
    pid = None
    if first & 0x06:
        pid = (buf[p] << 8) | buf[p + 1]
        p += 2
    plen = vbi_read(buf, p, end)
    p += vbi_size(plen)
    pend = p + plen
    props = {}
    users = []
    while p < pend:
        k = buf[p]
        if k == 0x26:
            kl = (buf[p + 1] << 8) | buf[p + 2]
            key = bytes(buf[p + 3:p + 3 + kl])
            q = p + 3 + kl
            vl = (buf[q] << 8) | buf[q + 1]
            users.append((key, bytes(buf[q + 2:q + 2 + vl])))
            p = q + 2 + vl
        elif k == 0x01:
            props[k] = buf[p + 1]
            p += 2
        elif k == 0x02:
            props[k] = P.u32(buf, p + 1)
            p += 5
        elif k == 0x23:
            props[k] = P.u16(buf, p + 1)
            p += 3
        elif k == 0x03:
            n = P.u16(buf, p + 1)
            props[k] = bytes(buf[p + 3:p + 3 + n])
            p += 3 + n
        else:
            raise AssertionError("unexpected property 0x%02x" % k)
    assert p == pend
    return first, topic, pid, props, users, pend


def test_publish_header_is_exact_and_right_aligned_across_vbi_boundaries():
    topic = b"mqbatch/dev-001/telemetry"
    checked = 0
    for payload_len in (1, 40, 60, 100, 16200, 16300, 16400, 70000):
        for qos in (0, 1, 2):
            for alias, tlen in ((0, len(topic)), (3, len(topic)), (3, 0)):
                enc = BatchEncoder(bytearray(128 + payload_len + 8), headroom=128, max_payload_bytes=200000)
                n = payload_len - 1
                while n + vbi_size(n) > payload_len:
                    n -= 1
                assert enc.add(b"r" * n) and enc.payload_len == payload_len, (payload_len, enc.payload_len)
                props = B.publish_props_len(enc.count_digits(), alias, 60, b"application/octet-stream", 0)
                hlen = B.publish_header_len(tlen, qos, props, payload_len)
                start = B.write_publish_header(enc.buf, enc.headroom, (qos << 1) | 0x08, topic, tlen, 0x1234,
                                               alias, 60, b"application/octet-stream", 0, enc)
                assert start == 128 - hlen
                first, t, pid, props_seen, users, pend = _parse_publish(enc.buf, start, enc.end)
                assert pend == enc.headroom  # header ends exactly where the payload starts
                assert first == 0x30 | (qos << 1) | 0x08
                assert t == (topic if tlen else b"")
                assert pid == (0x1234 if qos else None)
                assert users == [(b"batch-format", b"v1"), (b"batch-size", b"1")]
                assert props_seen.get(0x23) == (alias or None)
                assert props_seen[0x02] == 60 and props_seen[0x01] == 0
                assert props_seen[0x03] == b"application/octet-stream"
                checked += 1
    assert checked == 8 * 3 * 3
    print("PUBLISH headers checked:", checked)


def test_publish_batch_size_digits_and_headroom_error():
    enc = BatchEncoder(bytearray(400), headroom=60, max_count=200)
    for i in range(123):
        enc.add(b"")
    start = B.write_publish_header(enc.buf, enc.headroom, 0, b"t", 1, 0, 0, None, None, None, enc)
    users = _parse_publish(enc.buf, start, enc.end)[4]
    assert users == [(b"batch-format", b"v1"), (b"batch-size", b"123")]
    small = BatchEncoder(bytearray(100), headroom=20)
    small.add(b"x")
    msg = str_raises(ValueError, B.write_publish_header, small.buf, small.headroom, 2, b"some/topic", 10, 1, 0,
                     None, None, None, small)
    assert "headroom is 20" in msg, msg


def _connack(flags, code, *props):
    body = bytes((flags, code)) + _props(*props)
    return bytearray(body)


def test_connack_every_property_is_read():
    body = _connack(0, 0, _u32(0x11, 120), _u16(0x21, 7), b"\x24\x01", b"\x25\x00", _u32(0x27, 2048),
                    _s(0x12, b"auto-1"), _u16(0x22, 5), _s(0x1F, b"welcome"),
                    b"\x26\x00\x01k\x00\x01v", b"\x26\x00\x01k\x00\x01w", b"\x28\x00", b"\x29\x00", b"\x2a\x01",
                    _u16(0x13, 15), _s(0x1A, b"info"), _s(0x1C, b"other:8883"), _s(0x15, b"SCRAM"),
                    b"\x16\x00\x02\x01\x02")
    c = P.Connack()
    assert P.parse_connack(body, 0, len(body), c) == 0
    assert (c.session_expiry, c.receive_max, c.max_qos, c.retain_available, c.max_packet_size) == (120, 7, 1, False, 2048)
    assert (c.assigned_client_id, c.topic_alias_max, c.reason_string) == ("auto-1", 5, "welcome")
    assert (c.wildcard_sub_available, c.sub_id_available, c.shared_sub_available) == (False, False, True)
    assert (c.server_keep_alive, c.response_info, c.server_reference, c.auth_method) == (15, "info", "other:8883", "SCRAM")
    assert not c.session_present
    # absent properties take the specification's defaults
    body = _connack(1, 0)
    assert P.parse_connack(body, 0, len(body), c) == 0
    assert c.session_present and c.receive_max == 65535 and c.max_qos == 2 and c.retain_available
    assert c.topic_alias_max == 0 and c.max_packet_size == 268435460 and c.server_keep_alive is None


def test_every_reason_code_in_every_acknowledgement():
    c = P.Connack()
    counts = {}
    for code in range(256):
        body = _connack(0, code)
        r = P.parse_connack(body, 0, len(body), c)
        assert r == (code if code in P.CONNACK_CODES else P.E_BAD_REASON), (code, r)
        for ptype, codes in ((P.PUBACK, P.PUBACK_CODES), (P.PUBREC, P.PUBACK_CODES), (P.PUBCOMP, P.PUBCOMP_CODES)):
            for body in (bytes((0, 9, code)), bytes((0, 9, code, 0)), bytes((0, 9, code)) + _props(_s(0x1F, b"why"))):
                r = P.parse_ack(ptype, body, 0, len(body))
                assert r == (code if code in codes else P.E_BAD_REASON), (ptype, code, r)
                counts[ptype] = counts.get(ptype, 0) + (r >= 0)
        body = bytes((code,)) + _props(_s(0x1F, b"bye"), _s(0x1C, b"elsewhere"))
        r = P.parse_disconnect(body, 0, len(body))
        assert r == (code if code in P.DISCONNECT_CODES else P.E_BAD_REASON), (code, r)
        # + 0x04 (a client's DISCONNECT), 0x01 / 0x02 (SUBACK: Granted QoS 1 / 2, mqb_packet_e2e)
        known = P.CONNACK_CODES + P.PUBACK_CODES + P.PUBCOMP_CODES + P.DISCONNECT_CODES + b"\x04\x01\x02"
        assert (P.reason_name(code) == "unknown reason code") == (code not in known), code
    assert counts[P.PUBACK] == 3 * len(P.PUBACK_CODES) and counts[P.PUBCOMP] == 3 * len(P.PUBCOMP_CODES)
    for code in P.CONNACK_CODES + P.PUBACK_CODES + P.PUBCOMP_CODES + P.DISCONNECT_CODES:
        assert P.reason_name(code) != "unknown reason code", hex(code)
    assert (P.reason_name(0x87), P.reason_name(0x8E), P.reason_name(0x9C)) == (
        "Not authorized", "Session taken over", "Use another server")
    assert P.reason_name(0x05) == P.reason_name(0x100) == "unknown reason code"


def test_reason_name_allocates_only_the_name():
    # It runs on error paths, when a 64 KB heap may be nearly full and fragmented: the
    # 64K ACL test died here (MemoryError, 512 bytes) when it split the whole table.
    names = [P.reason_name(c) for c in (0x00, 0x87, 0xA2)]     # warm up (interned names)
    assert names == ["Success", "Not authorized", "Wildcard Subscriptions not supported"], names
    used = alloc_over(10, lambda i: P.reason_name(0xA2))
    print("reason_name(0xA2): %d B per call" % (used // 10))
    assert used // 10 <= 256, used      # split table: 3,104 B per call


def test_reason_string_and_server_reference_are_found():
    body = bytes((0, 7, 0x87)) + _props(b"\x26\x00\x01a\x00\x01b", _s(0x1F, b"topic not allowed"))
    assert P.parse_ack(P.PUBACK, body, 0, len(body)) == 0x87
    p = P.ack_props_start(P.PUBACK, body, 0, len(body))
    assert P.prop_string(body, p, len(body), P.P_REASON_STRING) == "topic not allowed"
    body = bytes((0x9C,)) + _props(_s(0x1C, b"backup.example:8883"), _s(0x1F, b"moved"))
    assert P.parse_disconnect(body, 0, len(body)) == 0x9C
    p = P.ack_props_start(P.DISCONNECT, body, 0, len(body))
    assert P.prop_string(body, p, len(body), P.P_SERVER_REFERENCE) == "backup.example:8883"
    assert P.prop_string(body, p, len(body), P.P_REASON_STRING) == "moved"
    assert P.prop_string(body, p, len(body), P.P_USER_PROPERTY) is None
    # no reason code / no properties
    assert P.parse_ack(P.PUBACK, b"\x00\x05", 0, 2) == 0
    assert P.parse_disconnect(b"", 0, 0) == 0
    assert P.ack_props_start(P.PUBACK, b"\x00\x05\x10", 0, 3) == 3


def test_malformed_connack_is_named():
    c = P.Connack()
    cases = (
        (b"\x00", P.E_TRUNCATED),
        (b"\x00\x00", P.E_TRUNCATED),                         # v5 needs the property length
        (b"\x02\x00\x00", P.E_BAD_FLAGS),
        (b"\x01\x87\x00", P.E_BAD_VALUE),                     # session present with an error code
        (b"\x00\x00\x05\x11\x00\x00", P.E_TRUNCATED),         # property length beyond the packet
        (b"\x00\x00\x01\x11\x00\x00\x00\x00", P.E_TRAILING),  # bytes after the properties
        (b"\x00\x00\x03\x11\x00\x00", P.E_TRUNCATED),         # four-byte value cut short
        (b"\x00\x00\x01\x00", P.E_BAD_PROPERTY),              # id 0 does not exist
        (b"\x00\x00\x01\x04", P.E_BAD_PROPERTY),              # id 4 does not exist
        (b"\x00\x00\x02\x80\x01", P.E_BAD_PROPERTY),          # a two-byte property id
        (b"\x00\x00\x03\x23\x00\x01", P.E_BAD_PROPERTY),      # Topic Alias is not a CONNACK property
        (b"\x00\x00\x02\x01\x00", P.E_BAD_PROPERTY),          # nor is Payload Format Indicator
        (b"\x00\x00\x06\x21\x00\x01\x21\x00\x02", P.E_DUP_PROPERTY),
        (b"\x00\x00\x05\x24\x00\x25\x01\x24", P.E_TRUNCATED),
        (b"\x00\x00\x04\x24\x00\x24\x01", P.E_DUP_PROPERTY),
        (b"\x00\x00\x03\x21\x00\x00", P.E_BAD_VALUE),         # Receive Maximum 0
        (b"\x00\x00\x02\x24\x02", P.E_BAD_VALUE),             # Maximum QoS 2 may not be sent
        (b"\x00\x00\x02\x25\x02", P.E_BAD_VALUE),
        (b"\x00\x00\x05\x27\x00\x00\x00\x00", P.E_BAD_VALUE),  # Maximum Packet Size 0
        (b"\x00\x00\x02\x28\x07", P.E_BAD_VALUE),
        (b"\x00\x00\x04\x1f\x00\x09a", P.E_TRUNCATED),        # string longer than the packet
        (b"\x00\x00\x06\x26\x00\x01k\x00\x05", P.E_TRUNCATED),  # user property value cut
        (b"\x00\x00\xff\xff\xff\xff\x7f", P.E_BAD_VALUE),      # property length VBI of 5 bytes
        (b"\x00\x00\xff\xff\xff\x7f", P.E_TRUNCATED),          # property length 268435455
        (b"\x00\x00\x80", P.E_TRUNCATED),                      # VBI ends early
    )
    for body, want in cases:
        r = P.parse_connack(bytearray(body), 0, len(body), c)
        assert r == want, (body, r, want)
        assert "not a parser error" not in P.error_text(want)


def test_malformed_acks_and_disconnects_are_named():
    cases = (
        (P.PUBACK, b"\x00", P.E_TRUNCATED),
        (P.PUBACK, b"\x00\x00", P.E_BAD_PACKET_ID),
        (P.PUBREC, b"\x00\x01\x00\x05\x1f\x00\x01", P.E_TRUNCATED),
        (P.PUBACK, b"\x00\x01\x00\x02\x1f\x00\x00", P.E_TRAILING),
        (P.PUBACK, b"\x00\x01\x00\x03\x1c\x00\x00", P.E_BAD_PROPERTY),  # Server Reference not in PUBACK
        (P.PUBCOMP, b"\x00\x01\x00\x03\x21\x00\x01", P.E_BAD_PROPERTY),
        (P.PUBACK, b"\x00\x01\x87\x06\x1f\x00\x00\x1f\x00\x00", P.E_DUP_PROPERTY),
        (P.PUBACK, b"\x00\x01\x00\x01\x3f", P.E_BAD_PROPERTY),
        (P.PUBCOMP, b"\x00\x01\x10", P.E_BAD_REASON),  # 0x10 is a PUBACK code, not a PUBCOMP one
    )
    for ptype, body, want in cases:
        assert P.parse_ack(ptype, bytearray(body), 0, len(body)) == want, (ptype, body)
    dcases = (
        (b"\x8e\x05\x11\x00\x00\x00\x00", P.E_BAD_PROPERTY),  # a server must not send Session Expiry
        (b"\x8e\x06\x1f\x00\x09abc", P.E_TRUNCATED),
        (b"\x8e\x01", P.E_TRUNCATED),
        (b"\x8e\x00\x00", P.E_TRAILING),
        (b"\x04", P.E_BAD_REASON),  # "Disconnect with Will Message" is for clients only
    )
    for body, want in dcases:
        assert P.parse_disconnect(bytearray(body), 0, len(body)) == want, body


def test_parsers_never_raise_on_random_and_mutated_input():
    valid = (bytes((0, 0)) + _props(_u16(0x21, 5), _s(0x1F, b"ok"), _u32(0x27, 900), b"\x26\x00\x01k\x00\x01v"),
             bytes((0, 1, 0x87)) + _props(_s(0x1F, b"denied")),
             bytes((0x95,)) + _props(_s(0x1F, b"too big"), _s(0x1C, b"x")))
    x = 12345
    c = P.Connack()
    results = {}
    for i in range(3000):
        src = bytearray(valid[i % 3])
        for _ in range(1 + i % 4):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            src[(x >> 8) % len(src)] = (x >> 16) & 0xFF
        n = len(src) - ((x >> 4) % 3 if i % 5 == 0 else 0)
        for r in (P.parse_connack(src, 0, n, c), P.parse_ack(P.PUBACK, src, 0, n), P.parse_ack(P.PUBCOMP, src, 0, n),
                  P.parse_disconnect(src, 0, n)):
            assert isinstance(r, int) and (r >= 0 or "not a parser error" not in P.error_text(r)), r
            results[r >= 0] = results.get(r >= 0, 0) + 1
    assert results[True] > 100 and results[False] > 100, results  # both outcomes were exercised
    print("fuzz outcomes (ok, malformed):", results.get(True), results.get(False))


def test_publish_header_and_ack_parsing_allocate_nothing():
    enc = BatchEncoder(bytearray(4096 + 96), headroom=96)
    for i in range(100):
        enc.add(b"0123456789abcdefghijklmn")
    topic = b"mqbatch/dev-001/telemetry"
    ack = bytearray(b"\x00\x07")
    ack_reason = bytearray(b"\x00\x07\x10\x00")

    def one(i):
        B.write_publish_header(enc.buf, enc.headroom, 2, topic, len(topic), (i & 0xFFF) + 1, 1, None, None, None, enc)
        P.parse_ack(P.PUBACK, ack, 0, 2)
        P.parse_ack(P.PUBACK, ack_reason, 0, 4)

    assert_no_alloc(one)
