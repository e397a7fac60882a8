# mqb_sub: one subscription of an mqb_client.Client (the e2e ack topic,
# docs/e2e-ack.md section 3): SUBSCRIBE (QoS 1, No Local) after every CONNACK
# without Session Present, its SUBACK, and every incoming PUBLISH (QoS 0/1)
# handed to a callback with its topic (a broker-assigned Topic Alias resolved)
# and the place of its payload in the client's receive buffer; QoS 1 is
# PUBACKed after the callback returns. Protocol violations end the connection
# like the client's own (DISCONNECT with the reason, MQTTError).
#
#   sub = Subscriber(client, b"mqbatch/dev-1/ack", on_message, on_suback)
#   client.connect()     # sends SUBSCRIBE; client.service() handles SUBACK and PUBLISH
#
# Imported only when a subscription is configured: a module costs heap on a
# board. Receiving allocates nothing unless the topic is not the subscribed one.
from array import array
from micropython import const
import mqb_packet as P
import mqb_packet_e2e as E

PENDING = const(-1)            # Subscriber.code while a SUBSCRIBE waits for its SUBACK
_TOPIC_ALIAS_INVALID = const(0x94)


class Subscriber:
    """A subscription to one topic (bytes, no wildcards) at QoS 1 with No Local.

    on_message(topic, buf, start, end): a PUBLISH arrived; its payload is
    buf[start:end] in the client's receive buffer (read it before returning).
    topic is self.topic when the PUBLISH's topic (or alias) is it, else a copy.
    on_suback(code, reason): the SUBACK's reason code (0 or 1: granted QoS;
    >= 0x80: refused, named by mqb_packet.reason_name) and its Reason String.
    code: None before the first SUBSCRIBE, PENDING until its SUBACK, then the
    SUBACK's code (kept over a resumed session: the broker kept the subscription
    or its absence). Registers itself as client.sub.
    """

    ALIAS_MAX = 1     # Topic Alias Maximum in CONNECT: one topic is ever sent to us

    def __init__(self, client, topic, on_message, on_suback=None):
        if not topic or topic.find(b"+") >= 0 or topic.find(b"#") >= 0:
            raise ValueError("subscription topic must be a non-empty topic name without wildcards: %r" % topic)
        self.client = client
        self.topic = topic
        self.on_message = on_message
        self.on_suback = on_suback
        self.code = None
        self.pid = 0                  # packet id of the SUBSCRIBE awaiting its SUBACK
        self.refused = 0              # SUBACKs >= 0x80
        self.received = 0             # PUBLISHes handed to on_message
        self._alias = None            # topic of Topic Alias 1 on this connection
        self._out = array("i", bytes(20))
        self._pkt = bytearray(10 + len(topic))
        client.sub = self

    def connected(self, session_present):
        """After a CONNACK: subscribe unless the broker kept this subscription."""
        self._alias = None            # aliases live as long as a connection
        if session_present and self.code is not None and self.code != PENDING:
            return
        c = self.client
        self.pid = c._new_pid()
        self.code = PENDING
        c._send(self._pkt, 0, E.subscribe_packet(self._pkt, self.pid, self.topic, 1 | E.NO_LOCAL))

    def handle(self, t, first, rx, n):
        """A SUBACK or PUBLISH (type t, fixed-header byte first) is in rx[0:n]."""
        c = self.client
        if t == E.SUBACK:
            if first & 0x0F:
                c._fail(P.MALFORMED_PACKET, "SUBACK with reserved flags 0x%X" % (first & 0x0F))
            r = E.parse_suback(rx, 0, n)
            if r < 0:
                c._fail(P.MALFORMED_PACKET, "SUBACK: " + P.error_text(r))
            if self.code != PENDING or P.u16(rx, 0) != self.pid:
                c._fail(P.PROTOCOL_ERROR, "SUBACK for packet id %d, which is not waiting for it" % P.u16(rx, 0))
            if 1 < r < 0x80:
                c._fail(P.PROTOCOL_ERROR, "SUBACK granted QoS %d, more than the QoS 1 asked" % r)
            self.code = r
            self.pid = 0
            reason = None
            if r >= 0x80:
                self.refused += 1
                reason = E.suback_reason(rx, 0, n)
            if self.on_suback:
                self.on_suback(r, reason)
            return
        out = self._out
        qos = E.parse_publish(first, rx, 0, n, out)
        if qos < 0:
            c._fail(P.MALFORMED_PACKET, "PUBLISH: " + P.error_text(qos))
        if qos > 1:
            c._fail(P.PROTOCOL_ERROR, "PUBLISH at QoS %d on a QoS 1 subscription" % qos)
        a = out[E.PUB_ALIAS]
        ts = out[E.PUB_TOPIC]
        tl = out[E.PUB_TOPIC_LEN]
        topic = self.topic if E.same(rx, ts, tl, self.topic) else None
        if topic is None and tl:
            topic = bytes(rx[ts:ts + tl])     # not our topic (a broker bug): rare, allocates
        if a >= 0:
            if a == 0 or a > self.ALIAS_MAX:
                c._fail(_TOPIC_ALIAS_INVALID, "PUBLISH with Topic Alias %d; this client's Topic Alias Maximum is %d"
                        % (a, self.ALIAS_MAX))
            if tl:
                self._alias = topic
            elif self._alias is None:
                c._fail(_TOPIC_ALIAS_INVALID, "PUBLISH with an empty topic and Topic Alias %d, never set on this "
                        "connection" % a)
            topic = self._alias
        self.received += 1
        self.on_message(topic, rx, out[E.PUB_PAYLOAD], n)
        if qos:
            c._send(c._tx, 0, P.ack_packet(c._tx, P.PUBACK, out[E.PUB_PID]))
