# mqb_packet_e2e: the MQTT 5.0 packets end-to-end acknowledgements need
# (docs/e2e-ack.md): SUBSCRIBE to one topic filter, its SUBACK, an incoming
# PUBLISH, and the batch-seq User Property of an outgoing batch PUBLISH.
#
# Pure serialisation like mqb_packet (whose readers and E_* results it uses):
# builders write into caller-owned buffers, parsers return a reason code / QoS
# (>= 0) or a negative E_* and fill a caller-owned array; nothing allocates.
# Imported only when e2e acks are configured. Heap on a board is per function
# and per new name (an interned name; a new qstr pool is ~7 KB once the current
# one is full): few functions, names the firmware already has where they fit.
# Section numbers refer to the MQTT Version 5.0 OASIS Standard.
import mqb_packet as P
from mqb_codec import BatchEncoder, vbi_read, vbi_size, vbi_write

_SUBSCRIBE_FIRST = const(0x82)   # 3.8.1: SUBSCRIBE with the reserved flags 0010
_P_PAYLOAD_FORMAT = const(0x01)
_P_SUBSCRIPTION_ID = const(0x0B)
_P_TOPIC_ALIAS = const(0x23)

# Subscription Options (3.8.3.1): QoS in bits 0-1, No Local 0x04, Retain As
# Published 0x08, Retain Handling in bits 4-5

# Reason codes of a SUBACK (3.9.3): granted QoS 0..2 and the refusals
_SUBACK_CODES = const(b"\x00\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2")
# REASON_STRING, USER_PROPERTY
_SUBACK_PROPS = const(b"\x1f\x26")
# Properties a server may send in a PUBLISH (3.3.2.3): Payload Format Indicator,
# Message Expiry Interval, Content Type, Response Topic, Correlation Data,
# Subscription Identifier, Topic Alias, User Property
_PUBLISH_PROPS = const(b"\x01\x02\x03\x08\x09\x0b\x23\x26")

# parse_publish() fills out[0..4] with (private: each public name costs heap):
# 0 position of the topic name, 1 its length (0: empty, a Topic Alias stands for it),
# 2 packet identifier (0 at QoS 0), 3 Topic Alias value, -1 if absent (0 is invalid:
# the caller says so), 4 position of the payload (it ends at the packet's end)
_PUB_TOPIC = const(0)
_PUB_TOPIC_LEN = const(1)
_PUB_PID = const(2)
_PUB_ALIAS = const(3)
_PUB_PAYLOAD = const(4)


def subscribe_packet(buf, pid, topic, flags):
    """Write a SUBSCRIBE (3.8) of one topic filter (bytes) with Subscription
    Options `flags` (QoS | 0x04 No Local | 0x08 Retain As Published | Retain Handling << 4)
    and no properties into buf[0:]; return its length. Allocation-free."""
    n = len(topic)
    if not 1 <= n <= 65535:
        raise ValueError("topic filter must be 1..65535 bytes, got %d" % n)
    if flags & 0xC0 or flags & 3 == 3 or (flags >> 4) & 3 == 3:
        raise ValueError("Subscription Options 0x%02X: reserved bits, QoS 3 or Retain Handling 3" % flags)
    if not 1 <= pid <= 65535:
        raise ValueError("packet identifier must be 1..65535, got %d" % pid)
    rl = 2 + 1 + 2 + n + 1    # packet id, property length 0, filter, options
    if 1 + vbi_size(rl) + rl > len(buf):
        raise ValueError("SUBSCRIBE of %d bytes does not fit a %d-byte buffer" % (1 + vbi_size(rl) + rl, len(buf)))
    buf[0] = _SUBSCRIBE_FIRST
    p = vbi_write(buf, 1, rl)
    buf[p] = pid >> 8
    buf[p + 1] = pid & 0xFF
    buf[p + 2] = 0
    buf[p + 3] = n >> 8
    buf[p + 4] = n & 0xFF
    p += 5
    buf[p:p + n] = topic
    buf[p + n] = flags
    return p + n + 1


def parse_suback(buf, start, end):
    """Check the variable header and payload of a SUBACK for one topic filter
    (buf[start:end]; its packet id is P.u16(buf, start)). Returns its reason code
    (0..2: the QoS granted, >= 0x80: refused; P.reason_name names it) or a negative
    E_*. Its Reason String: P.prop_string(buf, start + 2 + vbi_size(n), end - 1,
    P.P_REASON_STRING) with n = vbi_read(buf, start + 2, end)."""
    if end - start < 3:
        return P.E_TRUNCATED
    if P.u16(buf, start) == 0:
        return P.E_BAD_PACKET_ID
    n = vbi_read(buf, start + 2, end)
    if n < 0:
        return P.E_TRUNCATED if n == -1 else P.E_BAD_VALUE
    p = start + 2 + vbi_size(n)
    if p + n >= end:
        return P.E_TRUNCATED        # the properties run to the end: no reason code
    if p + n + 1 < end:
        return P.E_TRAILING         # more reason codes than topic filters
    err = P.props_check(buf, p, p + n, _SUBACK_PROPS)
    if err:
        return err
    code = buf[end - 1]
    return code if code in _SUBACK_CODES else P.E_BAD_REASON


def parse_publish(first, buf, start, end, out):
    """Parse an incoming PUBLISH: `first` its fixed-header byte, buf[start:end] its
    variable header and payload. Fills out (an array of 5 ints the caller owns,
    indexes above) and returns the QoS (0..2), or a negative E_*: QoS 3 or DUP at
    QoS 0 (E_BAD_FLAGS), packet id 0, a topic name with a wildcard or U+0000, an
    empty name without a Topic Alias, a Payload Format Indicator or Subscription
    Identifier out of range (E_BAD_VALUE), a property a server may not send.
    The payload is buf[out[4]:end], not copied. Allocation-free."""
    qos = (first >> 1) & 3
    if qos == 3 or (qos == 0 and first & 0x08):
        return P.E_BAD_FLAGS
    if end - start < 2:
        return P.E_TRUNCATED
    tlen = P.u16(buf, start)
    p = start + 2 + tlen
    if p > end:
        return P.E_TRUNCATED
    for i in range(start + 2, p):
        c = buf[i]
        if c == 0x23 or c == 0x2B or c == 0:     # '#', '+', U+0000
            return P.E_BAD_VALUE
    pid = 0
    if qos:
        if p + 2 > end:
            return P.E_TRUNCATED
        pid = P.u16(buf, p)
        if pid == 0:
            return P.E_BAD_PACKET_ID
        p += 2
    n = vbi_read(buf, p, end)
    if n < 0:
        return P.E_TRUNCATED if n == -1 else P.E_BAD_VALUE
    q = p + vbi_size(n)
    pe = q + n
    if pe > end:
        return P.E_TRUNCATED
    err = P.props_check(buf, q, pe, _PUBLISH_PROPS)
    if err:
        return err
    alias = -1
    while q < pe:
        pid_ = buf[q]
        if pid_ == _P_TOPIC_ALIAS:
            alias = P.u16(buf, q + 1)
        elif pid_ == _P_PAYLOAD_FORMAT and buf[q + 1] > 1:
            return P.E_BAD_VALUE
        elif pid_ == _P_SUBSCRIPTION_ID and vbi_read(buf, q + 1, pe) == 0:
            return P.E_BAD_VALUE
        q = P.prop_end(buf, q, pe)
    if tlen == 0 and alias < 0:
        return P.E_BAD_VALUE             # 3.3.2.1: an empty topic name needs a Topic Alias
    out[_PUB_TOPIC] = start + 2
    out[_PUB_TOPIC_LEN] = tlen
    out[_PUB_PID] = pid
    out[_PUB_ALIAS] = alias
    out[_PUB_PAYLOAD] = pe
    return qos


_BATCH_SEQ_KEY = const(b"\x26\x00\x09batch-seq")   # User Property id, key; + 2-byte length + value


class BatchSeq:
    """The User Property batch-seq = "B:F-L" (docs/e2e-ack.md section 1) of the next
    batch PUBLISH: set() before each publish; mqb_packet writes it when
    mqb_packet_build.batch_seq is this object. Allocation-free (for values < 2**30 on a
    32-bit port: small ints). The digits are written by BatchEncoder's own
    count_digits / write_count (they read self.count)."""

    boot = first_seq = last_seq = count = 0
    count_digits = BatchEncoder.count_digits
    write_count = BatchEncoder.write_count

    def set(self, boot, first_seq, last_seq):
        if not (0 <= first_seq <= last_seq <= 0xFFFFFFFF and 0 <= boot <= 0xFFFFFFFF):
            raise ValueError("batch-seq %d:%d-%d: need 0 <= F <= L < 2**32" % (boot, first_seq, last_seq))
        self.boot = boot
        self.first_seq = first_seq
        self.last_seq = last_seq

    def __len__(self):
        """The whole property's size (at most 46 bytes: mqb_app._BATCH_SEQ_ROOM)."""
        self.count = self.boot
        n = 16 + self.count_digits()
        self.count = self.first_seq
        n += self.count_digits()
        self.count = self.last_seq
        return n + self.count_digits()

    def write(self, buf, p):
        """Write the whole property at buf[p]; return the position after it."""
        n = len(_BATCH_SEQ_KEY)
        buf[p:p + n] = _BATCH_SEQ_KEY
        buf[p + n] = 0
        buf[p + n + 1] = len(self) - 14
        self.count = self.boot
        p = self.write_count(buf, p + n + 2)
        buf[p] = 0x3A     # ':'
        self.count = self.first_seq
        p = self.write_count(buf, p + 1)
        buf[p] = 0x2D     # '-'
        self.count = self.last_seq
        return self.write_count(buf, p + 1)
