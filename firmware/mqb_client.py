# mqb_client: a minimal MQTT 5.0 publishing client for batch-format v1.
#
# The connection and its session: CONNECT/CONNACK, reading and dispatching
# packets, keep alive, DISCONNECT. The in-flight table and the batch PUBLISH are
# mqb_inflight's (Client inherits Inflight); packets are built by
# mqb_packet_build and parsed by mqb_packet, bytes move through mqb_transport. The application owns the batch buffer
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
import mqb_packet as P
import mqb_packet_build as B
from mqb_codec import VBI_MAX, vbi_size
from mqb_transport import TransportError
from mqb_inflight import Inflight, MQTTError

# publish_batch() results that are not packet ids
BUSY = const(-1)           # Receive Maximum reached (or resends pending): service() and try again
NOT_CONNECTED = const(-2)  # no connection: connect() first; nothing was sent

# on_ack() code that is not an MQTT reason code
SESSION_LOST = const(-3)   # reconnected without a session: this message was not confirmed, publish it again

_SUBACK = const(9)
# Client._rs: the packet being read (_read_packet) and keep alive (ticks_ms values)
_RX_STATE = const(0)       # 0: before a packet, 1: in its Remaining Length, 2: in its body
_RX_FIRST = const(1)       # its first byte
_RX_LEN = const(2)         # its Remaining Length
_RX_MUL = const(3)
_RX_NVBI = const(4)        # Remaining Length bytes read
_RX_GOT = const(5)         # body bytes read
_KA_MS = const(6)          # keep alive (ms), 0: off
_LAST_TX = const(7)        # ticks_ms of the last send
_PING_AT = const(8)        # ticks_ms of the unanswered PINGREQ
_PING_OUT = const(9)       # 1: a PINGREQ awaits its PINGRESP
_N_RS = const(10)
_VBI_CAPS = const((127, 16383, 2097151, 268435455))  # largest value of a 1..4-byte VBI (VBI_MAX)


def _b(s):
    return s.encode() if isinstance(s, str) else s


class Client(Inflight):
    """MQTT 5.0 publisher over one mqb_transport.Transport.

    client_id: bytes ("" lets the broker assign one: Assigned Client Identifier
    is then used for later reconnects). keepalive: seconds (0 = off).
    session_expiry: seconds the broker keeps the session after a disconnect
    (0 = ends with the connection; > 0 enables resume and DUP resends).
    receive_max: in-flight slots (QoS 1/2) this client preallocates; the
    effective limit is min(receive_max, broker's Receive Maximum).
    max_packet_size: this client's own limit, sent in CONNECT; the receive buffer.
    alias_slots: topic aliases this client may use (bounded by the broker's maximum).
    will: optional mqb_packet_build.Will. on_ack(pid, code, reason_string): called from
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
        # the packet being read and keep alive, indexed by the _RX_* / _KA_* constants: one
        # array, not ten attributes (37 at most keep the instance dict at 592 bytes; one
        # more and it grows to a 752-byte block, which a 64 KB heap may not have in one run)
        self._rs = array("i", bytes(4 * _N_RS))

    # -- broker limits ----------------------------------------------------------

    def apply_budget(self, enc, topic, qos=1, expiry=None, content_type=None, payload_format=None):
        """Cap enc's payload (enc.set_budget) so that its PUBLISH on `topic` stays within
        the broker's Maximum Packet Size, counting fixed header, Remaining Length bytes,
        topic name, alias, packet id, properties and batch-size digits for enc.max_count.
        Call after every connect(). Returns the budget in bytes. Raises ValueError if
        enc's headroom cannot hold that header, MQTTError 0x95 if nothing fits."""
        props = B.publish_props_len(len(str(enc.max_count)), 1 if self._alias_n else 0, expiry, content_type,
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
        self._rs[_RX_STATE] = 0
        self.transport.open()
        sub = self.sub
        pkt = B.connect_packet(self.client_id, self.keepalive, clean_start, self.session_expiry,
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
        ptype = self._rs[_RX_FIRST] >> 4
        ca = self.connack
        if ptype != P.CONNACK or self._rs[_RX_FIRST] & 0x0F:
            self.transport.close()
            raise MQTTError(P.PROTOCOL_ERROR, "CONNACK", None, "expected CONNACK, got packet byte 0x%02X"
                            % self._rs[_RX_FIRST], True)
        r = P.parse_connack(self._rx, 0, self._rs[_RX_LEN], ca)
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
        self._rs[_KA_MS] = ka * 1000
        if ca.assigned_client_id:
            self.client_id = ca.assigned_client_id.encode()
        expiry = ca.session_expiry if ca.session_expiry is not None else self.session_expiry
        self.connected = True
        self.connects += 1
        self._rs[_PING_OUT] = 0
        self.pongs = self.pings
        self._rs[_LAST_TX] = time.ticks_ms()
        if ca.session_present:
            self._resume_session()
        else:
            self._drop_session()
        self._has_session = expiry > 0
        if sub is not None:
            sub.connected(ca.session_present)   # SUBSCRIBE unless the session kept it
        return ca.session_present

    def disconnect(self, reason=0):
        """Send DISCONNECT and close. The session (and unconfirmed messages) survive
        on the broker for session_expiry seconds."""
        if self.connected:
            try:
                self._send(self._tx, 0, B.disconnect_packet(self._tx, reason))
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

    def _send(self, buf, off, n):
        try:
            self.transport.send(buf, off, n)
        except TransportError:
            self.connected = False
            raise
        self._rs[_LAST_TX] = time.ticks_ms()

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
        h = self._tx               # its first 8 bytes: scratch (acks are sent whole, after a packet)
        while self._rs[_RX_STATE] < 2:
            if not tr.recv(h, 0, 1):
                return False
            b = h[0]
            if self._rs[_RX_STATE] == 0:
                self._rs[_RX_FIRST] = b
                self._rs[_RX_LEN] = 0
                self._rs[_RX_MUL] = 1
                self._rs[_RX_NVBI] = 0
                self._rs[_RX_STATE] = 1
                continue
            self._rs[_RX_LEN] += (b & 0x7F) * self._rs[_RX_MUL]
            self._rs[_RX_MUL] <<= 7
            self._rs[_RX_NVBI] += 1
            if b & 0x80:
                if self._rs[_RX_NVBI] == 4:
                    self._fail(P.MALFORMED_PACKET, "Remaining Length longer than 4 bytes")
                continue
            if self._rs[_RX_NVBI] > 1 and b == 0:
                self._fail(P.MALFORMED_PACKET, "Remaining Length not minimally encoded")
            if 1 + self._rs[_RX_NVBI] + self._rs[_RX_LEN] > len(self._rx):
                self._fail(P.PACKET_TOO_LARGE, "broker sent a %d-byte packet (type %d); this client's "
                           "Maximum Packet Size is %d" % (1 + self._rs[_RX_NVBI] + self._rs[_RX_LEN],
                                                          self._rs[_RX_FIRST] >> 4, len(self._rx)))
            self._rs[_RX_STATE] = 2
            self._rs[_RX_GOT] = 0
        while self._rs[_RX_GOT] < self._rs[_RX_LEN]:
            r = tr.recv(self._rx, self._rs[_RX_GOT], self._rs[_RX_LEN] - self._rs[_RX_GOT])
            if not r:
                return False
            self._rs[_RX_GOT] += r
        self._rs[_RX_STATE] = 0
        return True

    def _dispatch(self):
        first = self._rs[_RX_FIRST]
        t = first >> 4
        n = self._rs[_RX_LEN]
        rx = self._rx
        if t == P.PUBACK or t == P.PUBREC or t == P.PUBCOMP:
            self.handle(t, first, rx, n)
        elif t == P.PINGRESP:
            if first & 0x0F or n:
                self._fail(P.MALFORMED_PACKET, "PINGRESP with flags or a body")
            self._rs[_PING_OUT] = 0
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
                self.transport.send(self._tx, 0, B.disconnect_packet(self._tx, code))
            except TransportError as e:
                note = "DISCONNECT could not be sent: %s" % e
        self._closed()
        raise MQTTError(code, "received packet", None, detail + ("; " + note if note else ""), True)

    def ping(self):
        """Send a PINGREQ now; returns its number (self.pings). Once self.pongs
        reaches it, the broker has read everything sent before it (one connection's
        packets are handled in order, and PINGRESPs come back in order): the only
        sign that a QoS 0 PUBLISH got there. Raises TransportError if the link fails."""
        self._send(B.PINGREQ_PACKET, 0, 2)
        self.pings += 1
        if not self._rs[_PING_OUT]:
            self._rs[_PING_OUT] = 1
            self._rs[_PING_AT] = self._rs[_LAST_TX]
        return self.pings

    def _keepalive(self):
        ka = self._rs[_KA_MS]
        if not ka or not self.connected:
            return
        now = time.ticks_ms()
        if self._rs[_PING_OUT]:
            if time.ticks_diff(now, self._rs[_PING_AT]) > ka + (ka >> 1):
                self._closed()
                raise MQTTError(P.KEEP_ALIVE_TIMEOUT, "PINGRESP", None,
                                "no PINGRESP within 1.5 x keep alive (%d ms): the link is dead" % (ka + (ka >> 1)),
                                True)
        elif time.ticks_diff(now, self._rs[_LAST_TX]) >= ka - (ka >> 2):
            self._send(B.PINGREQ_PACKET, 0, 2)
            self._rs[_PING_OUT] = 1
            self._rs[_PING_AT] = now
            self.pings += 1
