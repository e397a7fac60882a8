# mqb_packet: MQTT 5.0 packets a publishing client receives: packet types, reason
# codes, properties, and the parsers. Pure, no I/O; the packets it sends are
# built by mqb_packet_build. Parsers read from a buffer and return a reason code
# (>= 0) or a negative E_* value naming what is malformed; acks are decoded to
# plain integers (nothing on the ack path allocates).
#
# Section numbers refer to the MQTT Version 5.0 OASIS Standard.
from mqb_codec import vbi_size, vbi_read, VBI_MAX

# -- control packet types (2.1.2) ---------------------------------------------
CONNECT = const(1)
CONNACK = const(2)
PUBLISH = const(3)
PUBACK = const(4)
PUBREC = const(5)
PUBREL = const(6)
PUBCOMP = const(7)
PINGRESP = const(13)
DISCONNECT = const(14)

_PACKET_NAMES = const("reserved CONNECT CONNACK PUBLISH PUBACK PUBREC PUBREL PUBCOMP SUBSCRIBE SUBACK "
                      "UNSUBSCRIBE UNSUBACK PINGREQ PINGRESP DISCONNECT AUTH")


def packet_name(ptype):
    """Name of a control packet type 0..15, e.g. 'PUBACK' (allocates: error paths)."""
    return _PACKET_NAMES.split()[ptype & 15]


# -- property identifiers (2.2.2.2); private ones are folded away by const() ---
# 0x01 Payload Format, 0x02 Message Expiry, 0x03 Content Type, 0x23 Topic Alias: mqb_packet_build
_P_RESPONSE_TOPIC = const(0x08)
_P_CORRELATION_DATA = const(0x09)
_P_SUBSCRIPTION_ID = const(0x0B)
_P_SESSION_EXPIRY = const(0x11)
_P_ASSIGNED_CLIENT_ID = const(0x12)
_P_SERVER_KEEP_ALIVE = const(0x13)
_P_AUTH_METHOD = const(0x15)
_P_AUTH_DATA = const(0x16)
_P_REQUEST_PROBLEM_INFO = const(0x17)
_P_WILL_DELAY = const(0x18)
_P_REQUEST_RESPONSE_INFO = const(0x19)
_P_RESPONSE_INFO = const(0x1A)
P_SERVER_REFERENCE = const(0x1C)
P_REASON_STRING = const(0x1F)
_P_RECEIVE_MAXIMUM = const(0x21)
_P_TOPIC_ALIAS_MAXIMUM = const(0x22)
_P_MAXIMUM_QOS = const(0x24)
_P_RETAIN_AVAILABLE = const(0x25)
P_USER_PROPERTY = const(0x26)
_P_MAXIMUM_PACKET_SIZE = const(0x27)
_P_WILDCARD_SUB_AVAILABLE = const(0x28)
_P_SUB_ID_AVAILABLE = const(0x29)
_P_SHARED_SUB_AVAILABLE = const(0x2A)

# Value type of each property id 0x00..0x2A: 0 unknown, 1 byte, 2 two-byte int,
# 4 four-byte int, 5 VBI, 6 UTF-8 string, 7 binary data, 8 string pair.
_PTYPE = const(b"\x00\x01\x04\x06\x00\x00\x00\x00\x06\x07\x00\x05\x00\x00\x00\x00"
               b"\x00\x04\x06\x02\x00\x06\x07\x01\x04\x01\x06\x00\x06\x00\x00\x06"
               b"\x00\x02\x02\x02\x01\x01\x08\x04\x01\x01\x01")

# Properties a server may send in each packet (2.2.2.2, 3.x.2.2).
# SESSION_EXPIRY, RECEIVE_MAXIMUM, MAXIMUM_QOS, RETAIN_AVAILABLE, MAXIMUM_PACKET_SIZE, ASSIGNED_CLIENT_ID,
# TOPIC_ALIAS_MAXIMUM, REASON_STRING, USER_PROPERTY, WILDCARD_SUB_AVAILABLE, SUB_ID_AVAILABLE,
# SHARED_SUB_AVAILABLE, SERVER_KEEP_ALIVE, RESPONSE_INFO, SERVER_REFERENCE, AUTH_METHOD, AUTH_DATA
_CONNACK_PROPS = const(b"\x11\x21\x24\x25\x27\x12\x22\x1f\x26\x28\x29\x2a\x13\x1a\x1c\x15"
                       b"\x16")
# REASON_STRING, USER_PROPERTY
_ACK_PROPS = const(b"\x1f\x26")
# a server MUST NOT send Session Expiry Interval in DISCONNECT (3.14.2.2.2): not listed
# REASON_STRING, USER_PROPERTY, SERVER_REFERENCE
_DISCONNECT_PROPS = const(b"\x1f\x26\x1c")

# -- reason codes (2.4): the ones the client and the App compare against; every
# code is named by reason_name() ------------------------------------------------------
_SUCCESS = const(0x00)
MALFORMED_PACKET = const(0x81)
PROTOCOL_ERROR = const(0x82)
BAD_USERNAME_OR_PASSWORD = const(0x86)
NOT_AUTHORIZED = const(0x87)
KEEP_ALIVE_TIMEOUT = const(0x8D)
PACKET_ID_NOT_FOUND = const(0x92)
RECEIVE_MAXIMUM_EXCEEDED = const(0x93)
PACKET_TOO_LARGE = const(0x95)
RETAIN_NOT_SUPPORTED = const(0x9A)
QOS_NOT_SUPPORTED = const(0x9B)

# Every reason code of MQTT 5.0 and its name, as two compact constants (a dict of
# strings would cost ~3.6 KB of RAM on a board that loads this module as .mpy).
_REASON_CODES = const(b"\x00\x01\x02\x04\x10\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c"
                      b"\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c"
                      b"\x9d\x9e\x9f\xa0\xa1\xa2")
_REASON_TEXT = const("Success|Granted QoS 1|Granted QoS 2|Disconnect with Will Message|No matching subscribers|Unspecified error|Malformed Packet|"
                     "Protocol Error|Implementation specific error|Unsupported Protocol Version|"
                     "Client Identifier not valid|Bad User Name or Password|Not authorized|Server unavailable|"
                     "Server busy|Banned|Server shutting down|Bad authentication method|Keep Alive timeout|"
                     "Session taken over|Topic Filter invalid|Topic Name invalid|Packet Identifier in use|"
                     "Packet Identifier not found|Receive Maximum exceeded|Topic Alias invalid|Packet too large|"
                     "Message rate too high|Quota exceeded|Administrative action|Payload format invalid|"
                     "Retain not supported|QoS not supported|Use another server|Server moved|"
                     "Shared Subscriptions not supported|Connection rate exceeded|Maximum connect time|"
                     "Subscription Identifiers not supported|Wildcard Subscriptions not supported")

# Reason codes a server may send in each packet (3.2.2.2, 3.4.2.1, 3.5.2.1, 3.7.2.1, 3.14.2.1).
CONNACK_CODES = bytes((0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
                       0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F))
PUBACK_CODES = bytes((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))  # also PUBREC
PUBCOMP_CODES = bytes((0x00, 0x92))
DISCONNECT_CODES = bytes((0x00, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
                          0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0,
                          0xA1, 0xA2))


def reason_name(code):
    """Name of an MQTT 5 reason code, e.g. 'Not authorized' (allocates only the
    name: error paths run when the heap may be nearly full, so no split list)."""
    i = _REASON_CODES.find(bytes((code & 0xFF,))) if 0 <= code <= 0xFF else -1
    if i < 0:
        return "unknown reason code"
    t = _REASON_TEXT
    a = 0
    while i:
        a = t.find("|", a) + 1
        i -= 1
    b = t.find("|", a)
    return t[a:b] if b >= 0 else t[a:]


# -- what a parser found malformed (negative results) --------------------------
E_TRUNCATED = const(-1)      # the packet ends inside a field
E_TRAILING = const(-2)       # bytes left after the last field
E_BAD_PROPERTY = const(-3)   # unknown property id, or one not allowed in this packet
E_DUP_PROPERTY = const(-4)   # a property that may appear once appears twice
E_BAD_VALUE = const(-5)      # a property or flag with a value the specification forbids
E_BAD_REASON = const(-6)     # a reason code not defined for this packet
E_BAD_FLAGS = const(-7)      # reserved fixed-header or acknowledge flags set
E_BAD_PACKET_ID = const(-8)  # packet identifier 0

_ERROR_TEXT = const("packet ends inside a field (truncated)|bytes left over after the last field|"
                    "unknown property, or property not allowed in this packet|"
                    "property that may appear only once appears twice|"
                    "property or flag value not allowed by the specification|"
                    "reason code not defined for this packet|reserved flags set|packet identifier 0")


def error_text(err):
    """What a negative E_* parser result means (allocates: error paths)."""
    return _ERROR_TEXT.split("|")[-err - 1] if -8 <= err < 0 else "not a parser error code: %d" % err


# -- small readers ------------------------------------------------------------


def u16(buf, pos):
    return (buf[pos] << 8) | buf[pos + 1]


def u32(buf, pos):
    return (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]


def string_at(buf, pos):
    """The UTF-8 string (2-byte length + data) at buf[pos] as str (allocates: error paths only)."""
    n = u16(buf, pos)
    try:
        return bytes(buf[pos + 2:pos + 2 + n]).decode()
    except UnicodeError:
        return repr(bytes(buf[pos + 2:pos + 2 + n]))


def prop_end(buf, pos, end):
    """Position after the property at buf[pos] (its id byte), or a negative E_*."""
    pid = buf[pos]
    if pid >= len(_PTYPE) or _PTYPE[pid] == 0:
        return E_BAD_PROPERTY  # also every id >= 0x80, i.e. a multi-byte VBI id: none is defined
    t = _PTYPE[pid]
    pos += 1
    if t == 1 or t == 2 or t == 4:
        pos += t
    elif t == 5:
        v = vbi_read(buf, pos, end)
        if v == -1:
            return E_TRUNCATED
        if v < 0:
            return E_BAD_VALUE
        pos += vbi_size(v)
    else:
        if pos + 2 > end:
            return E_TRUNCATED
        pos += 2 + u16(buf, pos)
        if t == 8:
            if pos + 2 > end:
                return E_TRUNCATED
            pos += 2 + u16(buf, pos)
    if pos > end:
        return E_TRUNCATED
    return pos


def props_check(buf, pos, end, allowed):
    """Validate the property block buf[pos:end] (after its length VBI): known ids
    that `allowed` (bytes of ids) lists, complete values, each at most once except
    User Property and Subscription Identifier. Returns 0 or a negative E_*.
    Allocation-free: the ids seen are two small-int bit masks."""
    lo = 0   # ids 0x00..0x17
    hi = 0   # ids 0x18..0x2A
    while pos < end:
        pid = buf[pos]
        if pid not in allowed:
            return E_BAD_PROPERTY
        q = prop_end(buf, pos, end)
        if q < 0:
            return q
        if pid != P_USER_PROPERTY and pid != _P_SUBSCRIPTION_ID:
            if pid < 24:
                bit = 1 << pid
                if lo & bit:
                    return E_DUP_PROPERTY
                lo |= bit
            else:
                bit = 1 << (pid - 24)
                if hi & bit:
                    return E_DUP_PROPERTY
                hi |= bit
        pos = q
    return 0


def props_find(buf, pos, end, pid):
    """Position of the value of property `pid` in a validated block, or -1."""
    while pos < end:
        if buf[pos] == pid:
            return pos + 1
        pos = prop_end(buf, pos, end)
    return -1


def prop_string(buf, pos, end, pid):
    """A string property's value as str, or None if absent (allocates)."""
    p = props_find(buf, pos, end, pid)
    return None if p < 0 else string_at(buf, p)


def props_block(buf, pos, end):
    """For buf[pos:end] starting with a property length VBI: the position of the
    first property, or a negative E_*. The block ends at pos + vbi_size(n) + n."""
    n = vbi_read(buf, pos, end)
    if n == -1:
        return E_TRUNCATED
    if n < 0:
        return E_BAD_VALUE
    start = pos + vbi_size(n)
    if start + n > end:
        return E_TRUNCATED
    if start + n < end:
        return E_TRAILING
    return start


# -- CONNACK (3.2) --------------------------------------------------------------


class Connack:
    """Everything a CONNACK said, with the specification's defaults for absent
    properties. The client keeps one and refills it at every connect. (User
    Properties and Authentication Data are validated, not kept.)"""

    def __init__(self):
        self.clear()

    def clear(self):
        self.reason = _SUCCESS
        self.session_present = False
        self.session_expiry = None       # None: as the client asked
        self.receive_max = 65535
        self.max_qos = 2
        self.retain_available = True
        self.max_packet_size = VBI_MAX + 5  # no limit given: the protocol's own
        self.assigned_client_id = None
        self.topic_alias_max = 0
        self.reason_string = None
        self.wildcard_sub_available = True
        self.sub_id_available = True
        self.shared_sub_available = True
        self.server_keep_alive = None    # None: the client's keep alive stands
        self.response_info = None
        self.server_reference = None
        self.auth_method = None


# CONNACK property ids and the Connack attribute each one sets (two constants in
# flash: a dict would be built in RAM at import)
# Session Expiry 0x11, Receive Maximum 0x21, Maximum QoS 0x24, Retain Available 0x25, Maximum Packet
# Size 0x27, Assigned Client Identifier 0x12, Topic Alias Maximum 0x22, Reason String 0x1F, Server Keep
# Alive 0x13, Server Reference 0x1C, Wildcard / Subscription Identifier / Shared Subscription Available
# 0x28 0x29 0x2A, Response Information 0x1A, Authentication Method 0x15
_CONNACK_ATTR_IDS = const(b"\x11\x21\x24\x25\x27\x12\x22\x1f\x13\x1c\x28\x29\x2a\x1a\x15")
_CONNACK_ATTR_NAMES = const(("session_expiry", "receive_max", "max_qos", "retain_available", "max_packet_size",
                             "assigned_client_id", "topic_alias_max", "reason_string", "server_keep_alive",
                             "server_reference", "wildcard_sub_available", "sub_id_available",
                             "shared_sub_available", "response_info", "auth_method"))


def parse_connack(buf, start, end, out):
    """Parse a CONNACK variable header buf[start:end] into `out` (a Connack).
    Returns the reason code (>= 0) or a negative E_*."""
    out.clear()
    if end - start < 3:
        return E_TRUNCATED  # flags, reason code and property length are all required in v5
    flags = buf[start]
    if flags & 0xFE:
        return E_BAD_FLAGS
    code = buf[start + 1]
    if code not in CONNACK_CODES:
        return E_BAD_REASON
    out.reason = code
    out.session_present = bool(flags & 1)
    if code >= 0x80 and out.session_present:
        return E_BAD_VALUE  # [MQTT-3.2.2-6]: session present must be 0 with an error code
    p = props_block(buf, start + 2, end)
    if p < 0:
        return p
    err = props_check(buf, p, end, _CONNACK_PROPS)
    if err:
        return err
    while p < end:
        pid = buf[p]
        t = _PTYPE[pid]
        if t == 1:  # every one-byte CONNACK property is 0 or 1 (Maximum QoS 2 is never sent)
            if buf[p + 1] > 1:
                return E_BAD_VALUE
            val = buf[p + 1] if pid == _P_MAXIMUM_QOS else buf[p + 1] == 1
        elif t == 2:
            val = u16(buf, p + 1)
        elif t == 4:
            val = u32(buf, p + 1)
        elif t == 6:
            val = string_at(buf, p + 1)
        for i in range(len(_CONNACK_ATTR_IDS)):
            if _CONNACK_ATTR_IDS[i] == pid:
                setattr(out, _CONNACK_ATTR_NAMES[i], val)
                break
        p = prop_end(buf, p, end)
    if out.receive_max == 0 or out.max_packet_size == 0:
        return E_BAD_VALUE
    return code


# -- PUBACK / PUBREC / PUBREL / PUBCOMP (3.4 - 3.7) and DISCONNECT (3.14) ---------


def parse_ack(ptype, buf, start, end):
    """Check an acknowledgement's variable header buf[start:end]; the packet id
    is u16(buf, start). Returns the reason code (>= 0) or a negative E_*.
    Allocation-free unless the packet carries two or more properties."""
    n = end - start
    if n < 2:
        return E_TRUNCATED
    if u16(buf, start) == 0:
        return E_BAD_PACKET_ID
    if n == 2:
        return _SUCCESS  # 3.4.2.1: no reason code means 0x00
    code = buf[start + 2]
    codes = PUBACK_CODES if ptype == PUBACK or ptype == PUBREC else PUBCOMP_CODES
    if code not in codes:
        return E_BAD_REASON
    if n == 3:
        return code  # no property length: no properties
    p = props_block(buf, start + 3, end)
    if p < 0:
        return p
    err = props_check(buf, p, end, _ACK_PROPS)
    return err if err else code


def parse_disconnect(buf, start, end):
    """Check a server DISCONNECT's variable header; returns its reason code or a negative E_*."""
    n = end - start
    if n == 0:
        return _SUCCESS
    code = buf[start]
    if code not in DISCONNECT_CODES:
        return E_BAD_REASON
    if n == 1:
        return code
    p = props_block(buf, start + 1, end)
    if p < 0:
        return p
    err = props_check(buf, p, end, _DISCONNECT_PROPS)
    return err if err else code


def ack_props_start(ptype, buf, start, end):
    """First property position of a validated ack or DISCONNECT (end if none)."""
    skip = 1 if ptype == DISCONNECT else 3
    if end - start <= skip:
        return end
    return start + skip + vbi_size(vbi_read(buf, start + skip, end))
