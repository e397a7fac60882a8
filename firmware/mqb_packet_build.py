# mqb_packet_build: MQTT 5.0 packets a publishing client sends (CONNECT, the
# batch PUBLISH header, acks, DISCONNECT): pure serialisation, no I/O; their
# parsers and the reason codes are mqb_packet's.
#
# Builders write into caller-owned buffers and return positions. Nothing on the
# publish path allocates: the PUBLISH header is written right-aligned in front
# of the batch payload (see mqb_codec.BatchEncoder's headroom).
#
# Section numbers refer to the MQTT Version 5.0 OASIS Standard.
from mqb_codec import vbi_size, vbi_write

# (private const() copies of mqb_packet's: folded into the bytecode, no global;
# tests/firmware/test_firmware_layout.py checks that the copies agree)
_CONNECT = const(1)
_PUBLISH = const(3)
_PUBREL = const(6)
_DISCONNECT = const(14)
_P_PAYLOAD_FORMAT = const(0x01)
_P_MESSAGE_EXPIRY = const(0x02)
_P_CONTENT_TYPE = const(0x03)
_P_TOPIC_ALIAS = const(0x23)

PINGREQ_PACKET = b"\xc0\x00"
_UP_BATCH_FORMAT = const(b"\x26\x00\x0cbatch-format\x00\x02v1")  # User Property batch-format = v1
_UP_BATCH_SIZE_KEY = const(b"\x26\x00\x0abatch-size")     # + 2-byte length + digits
_UP_BATCH_HMAC_KEY = const(b"\x26\x00\x0abatch-hmac\x00\x40")  # + 64 hex digits (docs/format.md)
# The batch's HMAC, sent as User Property batch-hmac when set: None, or the
# 64-byte buffer of hex digits mqb_hmac.BatchMac.sign() fills before each
# publish (mqb_app sets it when the config has hmac_key). Module state so that
# every size the client computes through publish_props_len (apply_budget, the
# Maximum Packet Size check) counts it without a change to its calls.
batch_mac = None
BATCH_MAC_PROPERTY_LEN = 79   # len(_UP_BATCH_HMAC_KEY) + 64
# The batch-seq User Property (docs/e2e-ack.md): None, or the
# mqb_packet_e2e.BatchSeq that mqb_app sets when e2e acks are on (set() before
# each publish; at its largest, 46 bytes, while a budget is computed): len() is
# the property's size, write() writes it. Module state as batch_mac is.
batch_seq = None


def _vbi(n):
    b = bytearray(vbi_size(n))
    vbi_write(b, 0, n)
    return b


def _str(data):
    """A UTF-8 string / binary data field: 2-byte length + bytes."""
    if len(data) > 65535:
        raise ValueError("string or binary field longer than 65535 bytes")
    return len(data).to_bytes(2, "big") + data


class Will:
    """A Will Message for CONNECT (3.1.2.5, 3.1.3.2), e.g. a retained "offline" status.
    topic, payload, content_type: bytes (str is encoded as UTF-8). delay: Will Delay
    Interval (s); expiry: Message Expiry Interval (s); payload_format: 0 or 1."""

    def __init__(self, topic, payload, qos=0, retain=False, delay=0, expiry=None,
                 content_type=None, payload_format=None):
        if qos not in (0, 1, 2):
            raise ValueError("Will QoS must be 0, 1 or 2, got %r" % (qos,))
        if not topic:
            raise ValueError("Will topic must not be empty")
        self.topic = topic.encode() if isinstance(topic, str) else topic
        self.payload = payload.encode() if isinstance(payload, str) else payload
        self.qos = qos
        self.retain = retain
        props = b""
        if delay:
            props += b"\x18" + delay.to_bytes(4, "big")
        if payload_format is not None:
            props += bytes((_P_PAYLOAD_FORMAT, payload_format))
        if expiry is not None:
            props += b"\x02" + expiry.to_bytes(4, "big")
        if content_type is not None:
            props += b"\x03" + _str(content_type.encode() if isinstance(content_type, str) else content_type)
        self.props = props


def connect_packet(client_id, keepalive, clean_start, session_expiry, receive_max, max_packet_size,
                   username=None, password=None, will=None, topic_alias_max=0):
    """A complete CONNECT packet (3.1) as a new bytearray (connects are rare: this allocates).
    client_id/username/password are bytes. max_packet_size: the client's receive
    buffer. topic_alias_max: topic aliases the server may use in PUBLISHes to this
    client (0: none; a publish-only client receives no PUBLISH)."""
    if not 0 <= keepalive <= 65535:
        raise ValueError("keep alive must be 0..65535 s, got %d" % keepalive)
    if not 1 <= receive_max <= 65535:
        raise ValueError("Receive Maximum must be 1..65535, got %d" % receive_max)
    flags = 0x02 if clean_start else 0
    props = b""
    if session_expiry:
        props += b"\x11" + session_expiry.to_bytes(4, "big")
    if receive_max != 65535:
        props += b"\x21" + receive_max.to_bytes(2, "big")
    if not 0 <= topic_alias_max <= 65535:
        raise ValueError("Topic Alias Maximum must be 0..65535, got %d" % topic_alias_max)
    props += b"\x27" + max_packet_size.to_bytes(4, "big") + b"\x22" + topic_alias_max.to_bytes(2, "big")
    tail = _str(client_id)
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        tail += _vbi(len(will.props)) + will.props + _str(will.topic) + _str(will.payload)
    if username is not None:
        flags |= 0x80
        tail += _str(username)
    if password is not None:
        flags |= 0x40
        tail += _str(password)
    body = b"\x00\x04MQTT\x05" + bytes((flags, keepalive >> 8, keepalive & 0xFF)) + _vbi(len(props)) + props + tail
    return bytearray(bytes((_CONNECT << 4,)) + _vbi(len(body)) + body)


def publish_props_len(count_digits, alias, expiry, content_type, payload_format):
    """Property bytes of a batch PUBLISH (without the property-length VBI).
    alias 0 = none; expiry/payload_format None = absent; content_type bytes or None."""
    n = len(_UP_BATCH_FORMAT) + len(_UP_BATCH_SIZE_KEY) + 2 + count_digits
    if alias:
        n += 3
    if expiry is not None:
        n += 5
    if content_type is not None:
        n += 3 + len(content_type)
    if payload_format is not None:
        n += 2
    if batch_mac is not None:
        n += len(_UP_BATCH_HMAC_KEY) + 64
    if batch_seq is not None:
        n += len(batch_seq)
    return n


def publish_header_len(topic_len, qos, props_len, payload_len):
    """Bytes in front of the payload: fixed header, Remaining Length, topic,
    packet id and properties. The whole packet is this + payload_len."""
    vh = 2 + topic_len + (2 if qos else 0) + vbi_size(props_len) + props_len
    return 1 + vbi_size(vh + payload_len) + vh


def write_publish_header(buf, end, flags, topic, topic_len, pid, alias, expiry, content_type,
                         payload_format, enc):
    """Write a batch PUBLISH header into buf so that it ends exactly at `end`
    (the encoder's headroom), in front of the enc.payload_len payload bytes.
    flags: DUP 0x08 | QoS << 1 | RETAIN 0x01. topic_len is len(topic), or 0 to
    send an empty name with the alias. Returns the start position of the packet.
    Allocation-free. Raises ValueError if the headroom is too small."""
    qos = (flags >> 1) & 3
    props = publish_props_len(enc.count_digits(), alias, expiry, content_type, payload_format)
    start = end - publish_header_len(topic_len, qos, props, enc.payload_len)
    if start < 0:
        raise ValueError("PUBLISH header needs %d bytes, encoder headroom is %d" % (end - start, end))
    buf[start] = (_PUBLISH << 4) | flags
    vh = 2 + topic_len + (2 if qos else 0) + vbi_size(props) + props
    p = vbi_write(buf, start + 1, vh + enc.payload_len)
    buf[p] = topic_len >> 8
    buf[p + 1] = topic_len & 0xFF
    p += 2
    if topic_len:
        buf[p:p + topic_len] = topic
        p += topic_len
    if qos:
        buf[p] = pid >> 8
        buf[p + 1] = pid & 0xFF
        p += 2
    p = vbi_write(buf, p, props)
    if payload_format is not None:
        buf[p] = _P_PAYLOAD_FORMAT
        buf[p + 1] = payload_format
        p += 2
    if expiry is not None:
        buf[p] = _P_MESSAGE_EXPIRY
        buf[p + 1] = (expiry >> 24) & 0xFF
        buf[p + 2] = (expiry >> 16) & 0xFF
        buf[p + 3] = (expiry >> 8) & 0xFF
        buf[p + 4] = expiry & 0xFF
        p += 5
    if alias:
        buf[p] = _P_TOPIC_ALIAS
        buf[p + 1] = alias >> 8
        buf[p + 2] = alias & 0xFF
        p += 3
    if content_type is not None:
        n = len(content_type)
        buf[p] = _P_CONTENT_TYPE
        buf[p + 1] = n >> 8
        buf[p + 2] = n & 0xFF
        buf[p + 3:p + 3 + n] = content_type
        p += 3 + n
    n = len(_UP_BATCH_FORMAT)
    buf[p:p + n] = _UP_BATCH_FORMAT
    p += n
    n = len(_UP_BATCH_SIZE_KEY)
    buf[p:p + n] = _UP_BATCH_SIZE_KEY
    p += n
    d = enc.count_digits()
    buf[p] = 0
    buf[p + 1] = d
    p = enc.write_count(buf, p + 2)
    if batch_mac is not None:
        n = len(_UP_BATCH_HMAC_KEY)
        buf[p:p + n] = _UP_BATCH_HMAC_KEY
        buf[p + n:p + n + 64] = batch_mac
        p += n + 64
    if batch_seq is not None:
        p = batch_seq.write(buf, p)
    if p != end:
        raise ValueError("PUBLISH header size mismatch: wrote to %d, expected %d" % (p, end))
    return start


def ack_packet(buf, ptype, pid, reason=0):
    """Write PUBREL (or another 4/5-byte ack) into buf[0:]; return its length."""
    buf[0] = (ptype << 4) | (2 if ptype == _PUBREL else 0)
    buf[2] = pid >> 8
    buf[3] = pid & 0xFF
    if reason:
        buf[1] = 3
        buf[4] = reason
        return 5
    buf[1] = 2
    return 4


def disconnect_packet(buf, reason=0):
    """Write a DISCONNECT with `reason` into buf[0:]; return its length."""
    buf[0] = _DISCONNECT << 4
    if reason == 0:
        buf[1] = 0
        return 2
    buf[1] = 1
    buf[2] = reason
    return 3
