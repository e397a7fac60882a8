# mqb_client: a minimal MQTT 5.0 publishing client for batch-format v1.
#
# Session and state machine only: packets are built and parsed by mqb_packet,
# bytes move through mqb_transport. The application owns the batch buffer
# (a mqb_codec.BatchEncoder) and the durable outbox; this client owns a small
# receive buffer and a fixed in-flight table, allocated once in __init__.
# Publishing, acknowledging and keep-alive allocate nothing.
#
#   t = Transport("broker.local", cafile="ca.der")
#   c = Client(t, b"dev-1", keepalive=30, session_expiry=3600, on_ack=acked)
#   c.connect()
#   c.apply_budget(enc, TOPIC, qos=1)          # encoder payload cap from Maximum Packet Size
#   pid = c.publish_batch(enc, TOPIC, qos=1)   # pid > 0, or BUSY / NOT_CONNECTED
#   c.service()                                 # non-blocking: acks -> acked(pid, code, reason)
#
# See docs/mqtt-client.md.
import time
from array import array
from micropython import const
import mqb_packet as P
from mqb_codec import VBI_MAX, vbi_size
from mqb_transport import TransportError

# publish_batch() results that are not packet ids
BUSY = const(-1)           # Receive Maximum reached (or resends pending): service() and try again
NOT_CONNECTED = const(-2)  # no connection: connect() first; nothing was sent

# on_ack() code that is not an MQTT reason code
SESSION_LOST = const(-3)   # reconnected without a session: this message was not confirmed, publish it again

# in-flight slot states
_FREE = const(0)
_WAIT_PUBACK = const(1)
_WAIT_PUBREC = const(2)
_WAIT_PUBCOMP = const(3)
_RESEND = const(4)         # session resumed: the application must resend it with DUP=1
_WAIT_PUBCOMP_AGAIN = const(5)  # PUBREL resent after a resume: PUBCOMP 0x92 means already completed

_SUBACK = const(9)
_SEQ_MASK = const(0x3FFFFFFF)
_VBI_CAPS = const((127, 16383, 2097151, 268435455))  # largest value of a 1..4-byte VBI (VBI_MAX)


class MQTTError(Exception):
    """An MQTT-level failure, never swallowed.

    code: the MQTT 5 reason code (e.g. 0x87); packet: where it came from
    ("CONNACK", "DISCONNECT", "PUBLISH", ...); reason: the broker's Reason
    String or None; detail: what the client saw (server reference, sizes...);
    local: True if the client detected it (nothing from the broker said so);
    server_reference: the broker's Server Reference (CONNACK or DISCONNECT, e.g.
    with 0x9C Use another server / 0x9D Server moved) or None.
    """

    def __init__(self, code, packet, reason=None, detail=None, local=False, server_reference=None):
        msg = "%s %s 0x%02X %s" % ("client-side" if local else "broker", packet, code, P.reason_name(code))
        if reason:
            msg += ": reason string %r" % reason
        if detail:
            msg += " (%s)" % detail
        super().__init__(msg)
        self.code = code
        self.packet = packet
        self.reason = reason
        self.detail = detail
        self.local = local
        self.server_reference = server_reference


def _b(s):
    return s.encode() if isinstance(s, str) else s


class Client:
    """MQTT 5.0 publisher over one mqb_transport.Transport.

    client_id: bytes ("" lets the broker assign one: Assigned Client Identifier
    is then used for later reconnects). keepalive: seconds (0 = off).
    session_expiry: seconds the broker keeps the session after a disconnect
    (0 = ends with the connection; > 0 enables resume and DUP resends).
    receive_max: in-flight slots (QoS 1/2) this client preallocates; the
    effective limit is min(receive_max, broker's Receive Maximum).
    max_packet_size: this client's own limit, sent in CONNECT; the receive buffer.
    alias_slots: topic aliases this client may use (bounded by the broker's maximum).
    will: optional mqb_packet.Will. on_ack(pid, code, reason_string): called from
    connect()/service()/flush() when a QoS 1/2 PUBLISH completes: code < 0x80
    success, >= 0x80 refused by the broker (not resent), SESSION_LOST. A PUBCOMP 0x92
    answering a PUBREL resent after a session resume is a completion (MQTT 5.0 4.3.3,
    4.9): reported as 0x00.
    sub: an mqb_sub.Subscriber sets itself here (a class attribute until then: an
    instance attribute more would grow every client's dict); None: publish only.
    """

    sub = None

    def __init__(self, transport, client_id, username=None, password=None, keepalive=60,
                 session_expiry=0, receive_max=4, max_packet_size=512, alias_slots=4, will=None,
                 on_ack=None, timeout_ms=10000):
        if not 1 <= receive_max <= 65535:
            raise ValueError("receive_max must be 1..65535, got %d" % receive_max)
        if max_packet_size < 16:
            raise ValueError("max_packet_size %d is too small for a server's acknowledgements" % max_packet_size)
        self.transport = transport
        self.client_id = _b(client_id)
        self.username = _b(username)
        self.password = _b(password)
        self.keepalive = keepalive
        self.session_expiry = session_expiry
        self.receive_max = receive_max
        self.max_packet_size = max_packet_size
        self.will = will
        self.on_ack = on_ack
        self.timeout_ms = timeout_ms
        self.connack = P.Connack()     # what the broker said at the last connect (its limits)
        self.connected = False
        # statistics
        self.connects = 0
        self.published = 0
        self.acked = 0                 # QoS 1/2 completed with a success code
        self.refused = 0               # QoS 1/2 completed with a code >= 0x80
        self.pings = 0
        self.pongs = 0                 # pings answered, counted as self.pings (ping()): an unanswered
                                       # PINGREQ of an earlier connection counts as answered
        self.peak_inflight = 0
        self.last_size = 0             # exact size of the last PUBLISH sent, in bytes
        # buffers and tables, allocated once
        self._rx = bytearray(max_packet_size)
        self._hdr = bytearray(1)
        self._tx = bytearray(8)
        self._pids = array("H", [0] * receive_max)
        self._state = bytearray(receive_max)
        self._qos = bytearray(receive_max)
        self._order = array("I", [0] * receive_max)
        self._aliases = [None] * alias_slots
        self._alias_n = 0
        self.inflight = 0              # QoS 1/2 PUBLISHes sent, not yet acknowledged
        self._resend = 0               # slots waiting for the application to resend
        self.limit = receive_max       # most in flight: min(receive_max, broker's Receive Maximum)
        self.max_send_size = VBI_MAX + 5  # largest packet the broker accepts (its Maximum Packet Size)
        self._seq = 0
        self._next_pid = 1
        self._has_session = False
        self._ka_ms = 0
        self._last_tx = 0
        self._ping_at = 0
        self._ping_out = False
        self._rx_state = 0
        self._rx_first = 0
        self._rx_len = 0
        self._rx_mul = 1
        self._rx_nvbi = 0
        self._rx_got = 0

    # -- broker limits ----------------------------------------------------------

    def apply_budget(self, enc, topic, qos=1, expiry=None, content_type=None, payload_format=None):
        """Cap enc's payload (enc.set_budget) so that its PUBLISH on `topic` stays within
        the broker's Maximum Packet Size, counting fixed header, Remaining Length bytes,
        topic name, alias, packet id, properties and batch-size digits for enc.max_count.
        Call after every connect(). Returns the budget in bytes. Raises ValueError if
        enc's headroom cannot hold that header, MQTTError 0x95 if nothing fits."""
        props = P.publish_props_len(len(str(enc.max_count)), 1 if self._alias_n else 0, expiry, content_type,
                                    payload_format)
        vh = 2 + len(topic) + (2 if qos else 0) + vbi_size(props) + props
        if 5 + vh > enc.headroom:
            raise ValueError("encoder headroom %d < %d bytes needed for the PUBLISH header on %r"
                             % (enc.headroom, 5 + vh, topic))
        best = 0
        for k in range(4):  # k + 1 Remaining Length bytes
            best = max(best, min(self.max_send_size - 2 - k - vh, _VBI_CAPS[k] - vh))
        if best < 1:
            raise MQTTError(P.PACKET_TOO_LARGE, "PUBLISH", None, "Maximum Packet Size %d leaves no room for a "
                            "payload on %r" % (self.max_send_size, topic), True)
        enc.set_budget(best)
        return best

    # -- connection -----------------------------------------------------------

    def connect(self, clean_start=None, timeout_ms=None):
        """Open the transport, send CONNECT, wait for CONNACK. Returns Session Present.

        clean_start None: start clean unless this client holds a session from an
        earlier connection. After a resumed session, pending_resend() lists the
        packet ids the application must publish again (resend_pid=...); with a
        new session, unconfirmed messages are reported to on_ack as SESSION_LOST.
        Raises MQTTError (CONNACK >= 0x80, malformed CONNACK...), TransportError,
        TLSError."""
        if self.connected:
            raise MQTTError(P.PROTOCOL_ERROR, "CONNECT", None, "already connected", True)
        if clean_start is None:
            clean_start = not self._has_session
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        self._rx_state = 0
        self.transport.open()
        sub = self.sub
        pkt = P.connect_packet(self.client_id, self.keepalive, clean_start, self.session_expiry,
                               self.receive_max, self.max_packet_size, self.username, self.password, self.will,
                               0 if sub is None else 1)    # Topic Alias Maximum: mqb_sub takes one
        self._send(pkt, 0, len(pkt))
        start = time.ticks_ms()
        while not self._read_packet():
            left = timeout_ms - time.ticks_diff(time.ticks_ms(), start)
            if left <= 0:
                self.transport.close()
                raise TransportError("no CONNACK within %d ms" % timeout_ms)
            self.transport.wait(left)
        ptype = self._rx_first >> 4
        ca = self.connack
        if ptype != P.CONNACK or self._rx_first & 0x0F:
            self.transport.close()
            raise MQTTError(P.PROTOCOL_ERROR, "CONNACK", None, "expected CONNACK, got packet byte 0x%02X"
                            % self._rx_first, True)
        r = P.parse_connack(self._rx, 0, self._rx_len, ca)
        if r < 0:
            self.transport.close()
            raise MQTTError(P.MALFORMED_PACKET, "CONNACK", None, P.error_text(r), True)
        if r >= 0x80:
            self.transport.close()
            if r == P.BAD_USERNAME_OR_PASSWORD or r == P.NOT_AUTHORIZED:
                self._has_session = False
            ref = ca.server_reference
            raise MQTTError(r, "CONNACK", ca.reason_string, ("server reference %r" % ref) if ref else None,
                            server_reference=ref)
        if ca.session_present and (clean_start or not self._has_session):
            self.transport.close()
            why = ("Session Present with Clean Start: protocol error [MQTT-3.2.2-2]" if clean_start else
                   "Session Present but this client holds no session state; connection closed as "
                   "[MQTT-3.2.2-4] requires: reconnect with clean_start=True")
            raise MQTTError(P.PROTOCOL_ERROR, "CONNACK", None, why, True)
        # limits of this connection
        self.limit = min(self.receive_max, ca.receive_max)
        self.max_send_size = min(ca.max_packet_size, VBI_MAX + 5)
        self._alias_n = min(len(self._aliases), ca.topic_alias_max)
        for i in range(len(self._aliases)):
            self._aliases[i] = None
        ka = ca.server_keep_alive if ca.server_keep_alive is not None else self.keepalive
        self._ka_ms = ka * 1000
        if ca.assigned_client_id:
            self.client_id = ca.assigned_client_id.encode()
        expiry = ca.session_expiry if ca.session_expiry is not None else self.session_expiry
        self.connected = True
        self.connects += 1
        self._ping_out = False
        self.pongs = self.pings
        self._last_tx = time.ticks_ms()
        if ca.session_present:
            self._resume_session()
        else:
            self._drop_session()
        self._has_session = expiry > 0
        if sub is not None:
            sub.connected(ca.session_present)   # SUBSCRIBE unless the session kept it
        return ca.session_present

    def _drop_session(self):
        """New session: every unconfirmed message is reported lost (the app publishes it again)."""
        for i in range(len(self._state)):
            if self._state[i] != _FREE:
                pid = self._pids[i]
                self._state[i] = _FREE
                if self.on_ack:
                    self.on_ack(pid, SESSION_LOST, None)
        self.inflight = 0
        self._resend = 0

    def _resume_session(self):
        """Session resumed: PUBLISHes not acknowledged wait for the application to resend
        them with DUP=1; QoS 2 messages past PUBREC get their PUBREL again."""
        self.inflight = 0
        self._resend = 0
        for pid in self.pending_resend((_WAIT_PUBACK, _WAIT_PUBREC, _WAIT_PUBCOMP, _WAIT_PUBCOMP_AGAIN)):
            i = self._find(pid)
            if self._state[i] == _WAIT_PUBCOMP or self._state[i] == _WAIT_PUBCOMP_AGAIN:
                self._state[i] = _WAIT_PUBCOMP_AGAIN
                self._send(self._tx, 0, P.ack_packet(self._tx, P.PUBREL, pid))
                self.inflight += 1
            else:
                self._state[i] = _RESEND
                self._resend += 1

    def pending_resend(self, states=(_RESEND,)):
        """Packet ids to publish again (publish_batch(..., resend_pid=pid)) after a
        resumed session, oldest first. Allocates a list."""
        idx = [i for i in range(len(self._state)) if self._state[i] in states]
        base = self._seq
        idx.sort(key=lambda i: (self._order[i] - base - 1) & _SEQ_MASK)
        return [self._pids[i] for i in idx]

    def abandon(self, pid):
        """Give up a message waiting for resend (e.g. its data is gone). True if it was one."""
        i = self._find(pid)
        if i < 0 or self._state[i] != _RESEND:
            return False
        self._state[i] = _FREE
        self._resend -= 1
        return True

    def disconnect(self, reason=0):
        """Send DISCONNECT and close. The session (and unconfirmed messages) survive
        on the broker for session_expiry seconds."""
        if self.connected:
            try:
                self._send(self._tx, 0, P.disconnect_packet(self._tx, reason))
            finally:
                self._closed()
        if not self.session_expiry:
            self._has_session = False

    def drop(self):
        """Close the connection without DISCONNECT (as a lost link does: the broker
        publishes the Will). In-flight state is kept for a resumed session."""
        self._closed()

    def _closed(self):
        self.connected = False
        self.transport.close()

    # -- publishing -------------------------------------------------------------

    def publish_batch(self, enc, topic, qos=1, retain=False, expiry=None, content_type=None,
                      payload_format=None, resend_pid=0):
        """Send the batch in `enc` (count >= 1) as one PUBLISH with User Properties
        batch-format=v1 and batch-size=enc.count, with one transport write.

        topic: bytes (the same object each time lets the topic alias be reused).
        expiry: Message Expiry Interval (s); content_type: bytes; payload_format: 0 or 1.
        resend_pid: a packet id from pending_resend(); sends it again with DUP=1.
        Returns the packet id (QoS 1/2), 0 (QoS 0 sent), BUSY or NOT_CONNECTED.
        Raises MQTTError (local) if the broker's limits forbid it (QoS, retain,
        packet size): nothing is sent. TransportError if the link fails."""
        if not self.connected:
            return NOT_CONNECTED
        ca = self.connack
        if enc.count < 1:
            raise ValueError("empty batch: batch-size must be a positive integer")
        if qos > ca.max_qos or qos < 0:
            raise MQTTError(P.QOS_NOT_SUPPORTED, "PUBLISH", None,
                            "QoS %d requested, broker's Maximum QoS is %d; nothing sent" % (qos, ca.max_qos), True)
        if retain and not ca.retain_available:
            raise MQTTError(P.RETAIN_NOT_SUPPORTED, "PUBLISH", None, "broker has Retain Available 0; nothing sent", True)
        if type(topic) is str or type(content_type) is str:
            raise TypeError("topic and content_type must be bytes (encode them once, outside the publish loop)")
        tlen = len(topic)
        if tlen == 0 or tlen > 65535 or topic.find(b"+") >= 0 or topic.find(b"#") >= 0:
            raise ValueError("topic name must be 1..65535 bytes without wildcards: %r" % topic)
        slot = -1
        pid = 0
        if qos:
            if resend_pid:
                slot = self._find(resend_pid)
                if slot < 0 or self._state[slot] != _RESEND:
                    raise ValueError("packet id %d is not waiting for a resend" % resend_pid)
                if self._qos[slot] != qos:
                    raise ValueError("packet id %d was sent with QoS %d" % (resend_pid, self._qos[slot]))
                if self.inflight >= self.limit:
                    return BUSY
                pid = resend_pid
            elif self._resend or self.inflight >= self.limit:
                return BUSY
        elif resend_pid:
            raise ValueError("resend_pid needs QoS 1 or 2")
        # topic alias: first use sends name + alias, later uses an empty name + alias
        alias = 0
        new_alias = -1
        for i in range(self._alias_n):
            a = self._aliases[i]
            if a is None:
                if new_alias < 0:
                    new_alias = i
            elif a == topic:
                alias = i + 1
                tlen = 0
                new_alias = -1
                break
        if new_alias >= 0:
            alias = new_alias + 1
        flags = (qos << 1) | (1 if retain else 0) | (0x08 if resend_pid else 0)
        props = P.publish_props_len(enc.count_digits(), alias, expiry, content_type, payload_format)
        size = P.publish_header_len(tlen, qos, props, enc.payload_len) + enc.payload_len
        if size > self.max_send_size:
            raise MQTTError(P.PACKET_TOO_LARGE, "PUBLISH", None,
                            "PUBLISH of %d bytes exceeds the broker's Maximum Packet Size %d; nothing sent"
                            % (size, self.max_send_size), True)
        if qos and not resend_pid:
            slot = self._free_slot()
            pid = self._new_pid()
        start = P.write_publish_header(enc.buf, enc.headroom, flags, topic, tlen, pid, alias, expiry,
                                       content_type, payload_format, enc)
        if qos:
            if resend_pid:
                self._resend -= 1
            self._pids[slot] = pid
            self._qos[slot] = qos
            self._state[slot] = _WAIT_PUBACK if qos == 1 else _WAIT_PUBREC
            self._seq = (self._seq + 1) & _SEQ_MASK
            self._order[slot] = self._seq
            self.inflight += 1
            if self.inflight > self.peak_inflight:
                self.peak_inflight = self.inflight
        self._send(enc.buf, start, size)
        if new_alias >= 0:
            self._aliases[new_alias] = topic
        self.last_size = size
        self.published += 1
        return pid

    def _find(self, pid):
        for i in range(len(self._state)):
            if self._state[i] != _FREE and self._pids[i] == pid:
                return i
        return -1

    def _free_slot(self):
        for i in range(len(self._state)):
            if self._state[i] == _FREE:
                return i
        raise MQTTError(P.RECEIVE_MAXIMUM_EXCEEDED, "PUBLISH", None, "no free in-flight slot", True)

    def _new_pid(self):
        while True:
            p = self._next_pid
            self._next_pid = p % 65535 + 1
            if self._find(p) < 0 and (self.sub is None or self.sub.pid != p):
                return p

    def _send(self, buf, off, n):
        try:
            self.transport.send(buf, off, n)
        except TransportError:
            self.connected = False
            raise
        self._last_tx = time.ticks_ms()

    # -- receiving ----------------------------------------------------------------

    def service(self):
        """Handle everything the broker sent (acks -> on_ack), send PINGREQ when idle,
        detect a dead link. Never blocks. Returns the number of PUBLISHes in flight,
        or NOT_CONNECTED. Raises MQTTError (server DISCONNECT, malformed packet,
        keep-alive timeout) or TransportError; the connection is then closed."""
        if not self.connected:
            return NOT_CONNECTED
        try:
            while self._read_packet():
                self._dispatch()
            self._keepalive()
        except TransportError:
            self._closed()
            raise
        return self.inflight

    def flush(self, timeout_ms=None):
        """service() until nothing is in flight or timeout_ms passed; returns the
        number still in flight (0 = all acknowledged)."""
        timeout_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        start = time.ticks_ms()
        while self.service() > 0:
            left = timeout_ms - time.ticks_diff(time.ticks_ms(), start)
            if left <= 0:
                break
            self.transport.wait(left if left < 1000 else 1000)
        return self.inflight

    def _read_packet(self):
        """Read towards one whole packet without blocking; True when rx holds it."""
        tr = self.transport
        h = self._hdr
        while self._rx_state < 2:
            if not tr.recv(h, 0, 1):
                return False
            b = h[0]
            if self._rx_state == 0:
                self._rx_first = b
                self._rx_len = 0
                self._rx_mul = 1
                self._rx_nvbi = 0
                self._rx_state = 1
                continue
            self._rx_len += (b & 0x7F) * self._rx_mul
            self._rx_mul <<= 7
            self._rx_nvbi += 1
            if b & 0x80:
                if self._rx_nvbi == 4:
                    self._fail(P.MALFORMED_PACKET, "Remaining Length longer than 4 bytes")
                continue
            if self._rx_nvbi > 1 and b == 0:
                self._fail(P.MALFORMED_PACKET, "Remaining Length not minimally encoded")
            if 1 + self._rx_nvbi + self._rx_len > len(self._rx):
                self._fail(P.PACKET_TOO_LARGE, "broker sent a %d-byte packet (type %d); this client's "
                           "Maximum Packet Size is %d" % (1 + self._rx_nvbi + self._rx_len, self._rx_first >> 4,
                                                          len(self._rx)))
            self._rx_state = 2
            self._rx_got = 0
        while self._rx_got < self._rx_len:
            r = tr.recv(self._rx, self._rx_got, self._rx_len - self._rx_got)
            if not r:
                return False
            self._rx_got += r
        self._rx_state = 0
        return True

    def _dispatch(self):
        first = self._rx_first
        t = first >> 4
        n = self._rx_len
        rx = self._rx
        if t == P.PUBACK or t == P.PUBREC or t == P.PUBCOMP:
            if first & 0x0F:
                self._fail(P.MALFORMED_PACKET, "%s with reserved flags 0x%X" % (P.packet_name(t), first & 0x0F))
            r = P.parse_ack(t, rx, 0, n)
            if r < 0:
                self._fail(P.MALFORMED_PACKET, "%s: %s" % (P.packet_name(t), P.error_text(r)))
            pid = P.u16(rx, 0)
            i = self._find(pid)
            want = _WAIT_PUBACK if t == P.PUBACK else (_WAIT_PUBREC if t == P.PUBREC else _WAIT_PUBCOMP)
            state = self._state[i] if i >= 0 else _FREE
            if state == _WAIT_PUBCOMP_AGAIN and t == P.PUBCOMP:
                if r == P.PACKET_ID_NOT_FOUND:
                    # MQTT 5.0 4.3.3 / 4.9: the broker completed this message before the
                    # link dropped (its PUBCOMP was lost): completion, not a refusal
                    r = 0
                state = want
            if i < 0 or state != want:
                if t == P.PUBREC:  # 4.3.3: answer PUBREL "Packet Identifier not found"
                    self._send(self._tx, 0, P.ack_packet(self._tx, P.PUBREL, pid, P.PACKET_ID_NOT_FOUND))
                    return
                self._fail(P.PROTOCOL_ERROR, "%s for packet id %d, which is not waiting for it"
                           % (P.packet_name(t), pid))
            if t == P.PUBREC and r < 0x80:
                self._state[i] = _WAIT_PUBCOMP
                self._send(self._tx, 0, P.ack_packet(self._tx, P.PUBREL, pid))
                return
            self._state[i] = _FREE
            self.inflight -= 1
            reason = None
            if r >= 0x80:
                self.refused += 1
                reason = P.prop_string(rx, P.ack_props_start(t, rx, 0, n), n, P.P_REASON_STRING)
            else:
                self.acked += 1
            if self.on_ack:
                self.on_ack(pid, r, reason)
        elif t == P.PINGRESP:
            if first & 0x0F or n:
                self._fail(P.MALFORMED_PACKET, "PINGRESP with flags or a body")
            self._ping_out = False
            self.pongs += 1
        elif t == P.DISCONNECT:
            if first & 0x0F:
                self._fail(P.MALFORMED_PACKET, "DISCONNECT with reserved flags")
            r = P.parse_disconnect(rx, 0, n)
            if r < 0:
                self._fail(P.MALFORMED_PACKET, "DISCONNECT: " + P.error_text(r))
            p = P.ack_props_start(t, rx, 0, n)
            reason = P.prop_string(rx, p, n, P.P_REASON_STRING)
            ref = P.prop_string(rx, p, n, P.P_SERVER_REFERENCE)
            self._closed()
            raise MQTTError(r, "DISCONNECT", reason, ("server reference %r" % ref) if ref else None,
                            server_reference=ref)
        elif self.sub is not None and (t == P.PUBLISH or t == _SUBACK):
            self.sub.handle(t, first, rx, n)
        else:
            self._fail(P.PROTOCOL_ERROR, "unexpected %s (packet byte 0x%02X) from the broker; this client "
                       "only publishes" % (P.packet_name(t), first))

    def _fail(self, code, detail):
        """A protocol violation by the broker: DISCONNECT with `code`, close, raise."""
        note = None
        if self.connected:
            try:
                self.transport.send(self._tx, 0, P.disconnect_packet(self._tx, code))
            except TransportError as e:
                note = "DISCONNECT could not be sent: %s" % e
        self._closed()
        raise MQTTError(code, "received packet", None, detail + ("; " + note if note else ""), True)

    def ping(self):
        """Send a PINGREQ now; returns its number (self.pings). Once self.pongs
        reaches it, the broker has read everything sent before it (one connection's
        packets are handled in order, and PINGRESPs come back in order): the only
        sign that a QoS 0 PUBLISH got there. Raises TransportError if the link fails."""
        self._send(P.PINGREQ_PACKET, 0, 2)
        self.pings += 1
        if not self._ping_out:
            self._ping_out = True
            self._ping_at = self._last_tx
        return self.pings

    def _keepalive(self):
        ka = self._ka_ms
        if not ka or not self.connected:
            return
        now = time.ticks_ms()
        if self._ping_out:
            if time.ticks_diff(now, self._ping_at) > ka + (ka >> 1):
                self._closed()
                raise MQTTError(P.KEEP_ALIVE_TIMEOUT, "PINGRESP", None,
                                "no PINGRESP within 1.5 x keep alive (%d ms): the link is dead" % (ka + (ka >> 1)),
                                True)
        elif time.ticks_diff(now, self._last_tx) >= ka - (ka >> 2):
            self._send(P.PINGREQ_PACKET, 0, 2)
            self._ping_out = True
            self._ping_at = now
            self.pings += 1
