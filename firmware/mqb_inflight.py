# mqb_inflight: the QoS 1/2 state of mqb_client.Client (which inherits Inflight):
# the fixed in-flight table (packet id, QoS, state and send order per slot), the
# batch PUBLISH written into the encoder's headroom and sent (publish_batch), the
# PUBACK / PUBREC / PUBCOMP that complete it (handle), and what a lost or resumed
# session does to it. The connection, CONNECT/CONNACK, reading packets and keep
# alive are mqb_client's; packets are built by mqb_packet_build, parsed by
# mqb_packet. Nothing here allocates on the publish/ack path.
import mqb_packet as P
import mqb_packet_build as B

# (private const() copies of mqb_client's BUSY, NOT_CONNECTED, SESSION_LOST: folded
# into the bytecode, no global; tests/firmware/test_firmware_layout.py checks them)
_BUSY = const(-1)
_NOT_CONNECTED = const(-2)
_SESSION_LOST = const(-3)

# in-flight slot states
_FREE = const(0)
_WAIT_PUBACK = const(1)
_WAIT_PUBREC = const(2)
_WAIT_PUBCOMP = const(3)
_RESEND = const(4)         # session resumed: the application must resend it with DUP=1
_WAIT_PUBCOMP_AGAIN = const(5)  # PUBREL resent after a resume: PUBCOMP 0x92 means already completed

_SEQ_MASK = const(0x3FFFFFFF)


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


class Inflight:
    """The in-flight table of mqb_client.Client (which inherits it): QoS 1/2
    PUBLISHes sent and not yet acknowledged, their packet ids and states, the batch
    PUBLISH written into the encoder's headroom (publish_batch), the acks that
    complete it (handle) and a session's loss or resume."""

    def _drop_session(self):
        """New session: every unconfirmed message is reported lost (the app publishes it again)."""
        for i in range(len(self._state)):
            if self._state[i] != _FREE:
                pid = self._pids[i]
                self._state[i] = _FREE
                if self.on_ack:
                    self.on_ack(pid, _SESSION_LOST, None)
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
                self._send(self._tx, 0, B.ack_packet(self._tx, P.PUBREL, pid))
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
            return _NOT_CONNECTED
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
                    return _BUSY
                pid = resend_pid
            elif self._resend or self.inflight >= self.limit:
                return _BUSY
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
        props = B.publish_props_len(enc.count_digits(), alias, expiry, content_type, payload_format)
        size = B.publish_header_len(tlen, qos, props, enc.payload_len) + enc.payload_len
        if size > self.max_send_size and new_alias >= 0:
            # without defining the alias (3 bytes) it may fit: e.g. a resend after a resume
            alias = 0
            new_alias = -1
            props = B.publish_props_len(enc.count_digits(), 0, expiry, content_type, payload_format)
            size = B.publish_header_len(tlen, qos, props, enc.payload_len) + enc.payload_len
        if size > self.max_send_size:
            raise MQTTError(P.PACKET_TOO_LARGE, "PUBLISH", None,
                            "PUBLISH of %d bytes exceeds the broker's Maximum Packet Size %d; nothing sent"
                            % (size, self.max_send_size), True)
        if qos and not resend_pid:
            slot = self._free_slot()
            pid = self._new_pid()
        start = B.write_publish_header(enc.buf, enc.headroom, flags, topic, tlen, pid, alias, expiry,
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

    def handle(self, t, first, rx, n):
        """A PUBACK, PUBREC or PUBCOMP in rx[:n] (its first byte `first`): the slot
        it completes, PUBREL for a PUBREC, on_ack(pid, code, reason)."""
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
                self._send(self._tx, 0, B.ack_packet(self._tx, P.PUBREL, pid, P.PACKET_ID_NOT_FOUND))
                return
            self._fail(P.PROTOCOL_ERROR, "%s for packet id %d, which is not waiting for it"
                       % (P.packet_name(t), pid))
        if t == P.PUBREC and r < 0x80:
            self._state[i] = _WAIT_PUBCOMP
            self._send(self._tx, 0, B.ack_packet(self._tx, P.PUBREL, pid))
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
