# mqb_sub: one subscription of an mqb_client.Client (the e2e ack topic,
# docs/e2e-ack.md section 3): SUBSCRIBE (QoS 1, No Local) after every CONNACK
# without Session Present, its SUBACK, and every incoming PUBLISH (QoS 0/1)
# handed to on_message with its topic (a broker-assigned Topic Alias resolved)
# and the place of its payload in the client's receive buffer; QoS 1 is
# PUBACKed after on_message returns. Protocol violations end the connection
# like the client's own (DISCONNECT with the reason, MQTTError).
#
#   sub = Subscriber(client, b"mqbatch/dev-1/ack", on_message, on_suback)
#   client.connect()     # sends SUBSCRIBE; client.service() handles SUBACK and PUBLISH
#
# Imported only when a subscription is configured (heap: see mqb_packet_e2e).
# Receiving allocates nothing unless the topic is not the subscribed one.
from array import array
import mqb_packet as P
import mqb_packet_build as B
import mqb_packet_e2e

# (private names: each public one costs heap on a board; see mqb_packet_e2e)
_PENDING = const(-1)           # Subscriber.code while a SUBSCRIBE waits for its SUBACK (-1)
_SUBACK = const(9)
_TOPIC_ALIAS_INVALID = const(0x94)
_OPTIONS = const(0x05)         # QoS 1 | No Local; Retain As Published 0, Retain Handling 0
_ALIAS_MAX = const(1)          # the Topic Alias Maximum mqb_client sends with a subscription


class Subscriber:
    """A subscription to one topic (bytes, no wildcards) at QoS 1 with No Local.

    on_message(topic, buf, start, end): a PUBLISH arrived; its payload is
    buf[start:end] in the client's receive buffer (read it before returning).
    topic is self.topic when the PUBLISH's topic (or alias) is it, else a copy.
    on_suback(code, reason): the SUBACK's reason code (0 or 1: granted QoS;
    >= 0x80: refused, named by mqb_packet.reason_name) and its Reason String.
    (A subclass may define them as methods instead: mqb_e2e.E2E.)
    code: None before the first SUBSCRIBE, -1 until its SUBACK, then the
    SUBACK's code (kept over a resumed session: the broker kept the subscription
    or its absence). refused: SUBACKs >= 0x80. Registers itself as client.sub.
    """

    code = None
    on_suback = None

    def __init__(self, client, topic, on_message=None, on_suback=None):
        if not topic or topic.find(b"+") >= 0 or topic.find(b"#") >= 0:
            raise ValueError("subscription topic must be a non-empty topic name without wildcards: %r" % topic)
        self.client = client
        self.topic = topic
        if on_message is not None:
            self.on_message = on_message
        if on_suback is not None:
            self.on_suback = on_suback
        self.pid = 0                  # packet id of the SUBSCRIBE awaiting its SUBACK
        self.refused = 0
        self._aliases = None          # topic of Topic Alias 1 on this connection
        self.out = array("i", bytes(20))    # what parse_publish found
        client.sub = self

    def connected(self, session_present):
        """After a CONNACK (client.connect): subscribe unless the broker kept this
        subscription. The SUBSCRIBE is built in the client's receive buffer (free now)."""
        self._aliases = None          # aliases live as long as a connection
        if session_present and self.code is not None and self.code != _PENDING:
            return
        c = self.client
        self.pid = c._new_pid()
        self.code = _PENDING
        c._send(c._rx, 0, mqb_packet_e2e.subscribe_packet(c._rx, self.pid, self.topic, _OPTIONS))

    def handle(self, ptype, first, buf, n):
        """A SUBACK or PUBLISH (type ptype, fixed-header byte first) is in buf[0:n]."""
        c = self.client
        rx = buf
        if ptype == _SUBACK:
            if first & 0x0F:
                c._fail(P.MALFORMED_PACKET, "SUBACK with reserved flags 0x%X" % (first & 0x0F))
            r = mqb_packet_e2e.parse_suback(rx, 0, n)
            if r < 0:
                c._fail(P.MALFORMED_PACKET, "malformed SUBACK: %s" % P.error_text(r))
            if self.code != _PENDING or P.u16(rx, 0) != self.pid:
                c._fail(P.PROTOCOL_ERROR, "SUBACK for packet id %d, which is not waiting for it" % P.u16(rx, 0))
            if 1 < r < 0x80:
                c._fail(P.PROTOCOL_ERROR, "SUBACK granted QoS %d, more than the QoS 1 asked" % r)
            self.code = r
            self.pid = 0
            reason = None
            if r >= 0x80:
                self.refused += 1
                reason = P.prop_string(rx, 3 if rx[2] < 0x80 else 4, n - 1, P.P_REASON_STRING)
            if self.on_suback is not None:
                self.on_suback(r, reason)
            return
        out = self.out
        qos = mqb_packet_e2e.parse_publish(first, rx, 0, n, out)
        if qos < 0:
            c._fail(P.MALFORMED_PACKET, "malformed PUBLISH: %s" % P.error_text(qos))
        if qos > 1:
            c._fail(P.PROTOCOL_ERROR, "PUBLISH at QoS %d on a QoS 1 subscription" % qos)
        a = out[3]                    # Topic Alias, -1: none
        ts = out[0]                   # the topic name: rx[ts:ts + tl]
        tl = out[1]
        topic = self.topic
        if tl != len(topic):
            topic = None
        else:
            for i in range(tl):
                if rx[ts + i] != topic[i]:
                    topic = None
                    break
        if topic is None and tl:
            topic = bytes(rx[ts:ts + tl])     # not our topic (a broker bug): rare, allocates
        if a >= 0:
            if a == 0 or a > _ALIAS_MAX:
                c._fail(_TOPIC_ALIAS_INVALID, "PUBLISH with Topic Alias %d; this client's Topic Alias Maximum is %d"
                        % (a, _ALIAS_MAX))
            if tl:
                self._aliases = topic
            elif self._aliases is None:
                c._fail(_TOPIC_ALIAS_INVALID, "PUBLISH with an empty topic and Topic Alias %d, never set on this "
                        "connection" % a)
            topic = self._aliases
        self.on_message(topic, rx, out[4], n)
        if qos:
            c._send(c._tx, 0, B.ack_packet(c._tx, P.PUBACK, out[2]))
