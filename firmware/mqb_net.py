# mqb_net: the network session, a part of the App (mqb_app): connect with
# backoff (Maximum QoS, Will and server-reference handling), drain the outbox
# oldest first within Receive Maximum (resends of a resumed session first),
# PUBACKs and refusals, keep alive. The MQTT itself is mqb_client's.
import os
import time

import mqb_board as board
import mqb_packet as P
from mqb_client import BUSY, SESSION_LOST, MQTTError
from mqb_flush import log
from mqb_transport import TransportError

# Broker refusals worth retrying later (the batch stays in the outbox); any other
# code >= 0x80 on a PUBACK is final: the batch is discarded and its records counted
# as dropped on the device (health record dropped_total), never silently.
# (private const() copies of mqb_app's: folded into the bytecode, no global)
_TRANSIENT = const(b"\x80\x83\x89\x97")   # Unspecified, Implementation specific, Server busy, Quota exceeded
_NO_MATCHING_SUBSCRIBERS = const(0x10)
_SUB_PENDING = const(-1)                  # mqb_sub._PENDING: a SUBSCRIBE awaits its SUBACK
_USE_ANOTHER_SERVER = const(0x9C)
_SERVER_MOVED = const(0x9D)
_ACKED_BATCHES = const(3)
_ACKED_RECORDS = const(4)
_REFUSED_BATCHES = const(5)
_UNHEARD = const(6)            # PUBACK 0x10: nobody subscribed; kept and resent
_RECONNECTS = const(7)
_CONNECTS = const(8)
_LAST_ERROR = const(9)
_PUBLISHES = const(11)
_QOS0_BATCHES = const(14)      # sent at QoS 0 and read by the broker (PINGRESP after them): no delivery ack
_QOS0_RECORDS = const(15)
_QOS0_PING = const(16)         # QoS 0: number of the PINGREQ whose PINGRESP confirms the batches sent (0: none)
_QOS_CFG = const(0)
_QOS_PUB = const(1)
_QOS_MIN = const(2)
_AT_CONNECT = const(3)
_AT_HOLD = const(4)
_AT_CONNECTED = const(5)
_MS_BACKOFF = const(3)
_MS_BACKOFF_MAX = const(4)


class Session:
    """The App's network methods (mqb_app.App inherits them)."""

    def _backoff(self, now):
        delay = self.ms[_MS_BACKOFF] << min(self.backoff_n, 16)
        if delay > self.ms[_MS_BACKOFF_MAX]:
            delay = self.ms[_MS_BACKOFF_MAX]
        delay = delay // 2 + (int.from_bytes(os.urandom(2), "little") * (delay // 2)) // 65536  # jitter
        self.backoff_n += 1
        self.at[_AT_CONNECT] = time.ticks_add(now, delay)
        return delay

    def _connect(self, now):
        c = self.client
        if not board.network_up() and not board.network_connect(self.net_cfg):
            log("network down; retry in %d ms" % self._backoff(now))
            return
        if not self.clock.synced and board.sync_time():
            self.clock.set_from_rtc(True)
        self.count[_QOS0_PING] = 0
        for i in range(len(self._eid)):
            if self._pid[i] == 0:
                if self.client.sub is not None and self._eid[i] >= 0:
                    self.client.sub.discard(self._eid[i])
                self._eid[i] = -1       # QoS 0 batches the broker did not confirm: sent again
        try:
            present = c.connect()
            # publish at min(qos, the broker's Maximum QoS) (MQTT 5 3.3.1.2 lets a client
            # publish lower), logged when it changes; below min_qos nothing is sent
            top = c.connack.max_qos
            qos = self.qos
            q = qos[_QOS_CFG] if qos[_QOS_CFG] < top else top
            if q < qos[_QOS_MIN]:
                c.drop()
                raise MQTTError(P.QOS_NOT_SUPPORTED, "CONNACK", None, "broker's Maximum QoS %d is below min_qos %d: "
                                "batches stay in the outbox, none is sent until the broker allows QoS %d"
                                % (top, qos[_QOS_MIN], qos[_QOS_MIN]), True)
            if q != qos[_QOS_PUB]:
                log("broker Maximum QoS %d: batches published at QoS %d (config qos %d)%s"
                    % (top, q, qos[_QOS_CFG], "; each stays in the outbox until the broker answers a PINGREQ sent "
                       "after it" if q == 0 else ""))
                qos[_QOS_PUB] = q
            if self.count[_CONNECTS]:
                self.count[_RECONNECTS] += 1
            self.count[_CONNECTS] += 1
            self.at[_AT_CONNECTED] = now
            self.cursor = -1
            # batches must fit the broker's Maximum Packet Size from now on (MQTTError
            # if its limit leaves no room for a batch at all)
            c.apply_budget(self.enc, self.topic, self.qos[_QOS_PUB])
            c.apply_budget(self.out, self.topic, self.qos[_QOS_PUB])
            self._resend_pending = present   # _drain() sends them first, within Receive Maximum
            self._measure_live()
            log("connected (session present %d, receive max %d, max packet %d, batch payload limit %d)"
                % (present, c.limit, c.max_send_size, self.enc.limit))
        except (MQTTError, TransportError) as e:
            self._failed(e, now)

    def _failed(self, e, now):
        """A connection attempt or an established link failed: log the reason code, back off."""
        if isinstance(e, MQTTError):
            self.count[_LAST_ERROR] = e.code
            ref = e.server_reference
            if e.code in (_USE_ANOTHER_SERVER, _SERVER_MOVED) and ref:
                self._use_server(ref)
            if e.packet == "CONNACK":
                # the broker refused the Will (MQTT 5 3.2.2.3: 0x9B its QoS, 0x9A its retain
                # flag): lower it and connect again at once
                w = self.client.will
                if not e.local and (e.code == P.QOS_NOT_SUPPORTED and w.qos or
                                    e.code == P.RETAIN_NOT_SUPPORTED and w.retain):
                    if e.code == P.QOS_NOT_SUPPORTED:
                        w.qos -= 1
                        log("broker refused the Will's QoS (CONNACK 0x9B): the Will is now sent at QoS %d" % w.qos)
                    else:
                        w.retain = False
                        log("broker refused a retained Will (CONNACK 0x9A Retain not supported): "
                            "the Will is now sent unretained")
                    self.at[_AT_CONNECT] = now
                    log("link: %s; reconnecting now" % e)
                    return
                if e.local and e.code == P.QOS_NOT_SUPPORTED:
                    self.backoff_n = 16          # below min_qos: only a broker change helps, try seldom
        else:
            code = e.errno
            self.count[_LAST_ERROR] = -abs(code) if isinstance(code, int) and code else -1
        if self.client.connected:
            self.client.drop()
        if self.backoff_n and time.ticks_diff(now, self.at[_AT_CONNECTED]) > 30000:
            self.backoff_n = 0       # the link had been up a while: start the backoff again
        log("link: %s; retry in %d ms" % (e, self._backoff(now)))

    def _use_server(self, ref):
        host, _, port = ref.partition(":")
        self.client.transport.host = host
        if port:
            self.client.transport.port = int(port)
        log("server reference: next connect goes to %s" % ref)

    def _slot(self, pid):
        for i in range(len(self._pid)):
            if self._eid[i] >= 0 and self._pid[i] == pid:
                return i
        return -1

    def _in_flight(self, eid):
        for i in range(len(self._eid)):
            if self._eid[i] == eid:
                return True
        return False

    def _publish(self, eid, resend_pid=0):
        """Publish the batch _load(eid) put in the send buffer (the outbox's entry_*
        fields are still those of eid)."""
        # (no new locals here and in _drain / _on_ack: a larger frame is allocated on the heap
        # per call in MicroPython, which splits the free runs a 64 KB heap needs)
        c = self.client
        if self.mac is not None:       # batch-hmac: mqb_packet_build.batch_mac is self.mac.hex
            out = self.out
            self.mac.sign(self.topic, out.count, memoryview(out.buf)[out.headroom:out.end])
        if c.sub is not None:          # e2e acks (mqb_e2e.E2E): batch-seq, mqb_packet_build.batch_seq is c.sub.seq
            out = self.outbox
            c.sub.seq.set(out.entry_boot, out.entry_first_seq, out.entry_last_seq)
        pid = c.publish_batch(self.out, self.topic, self.qos[_QOS_PUB], resend_pid=resend_pid)
        if pid == BUSY:
            return False
        if c.sub is not None:
            c.sub.add(eid)
        self.count[_PUBLISHES] += 1
        self.wire_bytes += c.last_size
        if resend_pid:                 # its slot is the first transmission's (_resend found it): taking
            return True                # a free one would hold it twice, one copy never freed by its ack
        for i in range(len(self._eid)):      # QoS 0: pid 0, the slot waits for a PINGRESP (_drain)
            if self._eid[i] < 0 or (pid and self._pid[i] == pid):
                self._eid[i] = eid
                self._pid[i] = pid
                return True
        raise RuntimeError("in-flight table full: client allowed more than receive_max")

    def _resend(self):
        """After a resumed session, publish again (DUP=1, same packet id) what the broker
        had not acknowledged. False while Receive Maximum holds some of them back."""
        c = self.client
        for pid in c.pending_resend():
            i = self._slot(pid)
            eid = self._eid[i] if i >= 0 else -1
            n = self._load(eid, True) if eid >= 0 else -1
            if n >= 0:
                try:
                    if not self._publish(eid, pid):
                        return False
                    continue
                except MQTTError as e:   # larger than the broker now allows: stored again in parts
                    if e.code != P.PACKET_TOO_LARGE or not e.local:
                        raise
                    self._split(eid, n, self.out.buf)
            c.abandon(pid)               # its data is gone or was re-stored: nothing to resend
            if i >= 0:
                self._eid[i] = -1
        return True

    def _drain(self, now):
        """Send stored batches, oldest first, while Receive Maximum allows: first the
        resends of a resumed session (the client takes nothing new before them).
        With e2e acks: nothing until the ack subscription is answered, then the
        resends mqb_e2e paces (E2E.pop), then new ones: the whole outbox may await e2e acks."""
        c = self.client                # c.sub: mqb_e2e.E2E with e2e acks on, else None
        if c.sub is not None and c.sub.code == _SUB_PENDING:
            return                       # SUBACK first: it says whether PUBACK ends the line
        if self._resend_pending:
            if not self._resend():
                return
            self._resend_pending = False
        if time.ticks_diff(now, self.at[_AT_HOLD]) < 0:
            return
        qos0 = self.qos[_QOS_PUB] == 0
        if qos0 and self.count[_QOS0_PING]:
            # QoS 0 has no acknowledgement: the batches sent (slots with packet id 0) stay
            # in the outbox until the broker answers the PINGREQ sent after them; then
            # they are removed, counted qos0 (read by the broker, delivery unconfirmed)
            if c.pongs < self.count[_QOS0_PING]:
                return
            self.count[_QOS0_PING] = 0
            for i in range(len(self._eid)):
                eid = self._eid[i]
                if eid >= 0:
                    self._eid[i] = -1
                    if c.sub is not None and c.sub.ack(eid):
                        continue         # read by the broker: now awaits its e2e ack
                    n = self.outbox.records(eid)
                    if self.outbox.ack(eid) == 0:
                        self.count[_QOS0_BATCHES] += 1
                        self.count[_QOS0_RECORDS] += n
        sent = 0
        if c.sub is not None:
            # e2e acks overdue: a new PUBLISH of the same entry (DUP 0), counted
            while c.connected and (self._in_flight(-1) if qos0 else c.inflight < c.limit):
                eid = c.sub.pop(now)
                if eid < 0:
                    break
                if self._load(eid) < 0:
                    c.sub.discard(eid)   # gone, corrupt or re-stored split (or kept: no RAM to split)
                    continue
                if not self._publish(eid):
                    c.sub.ack(eid)       # BUSY: wait again (cannot happen below the limit)
                    break
                c.sub.values[0] += 1     # e2e_resends
                sent += 1
        while c.connected and (self._in_flight(-1) if qos0 else c.inflight < c.limit):
            if not self.outbox.peek(self._ids, 1, self.cursor):
                break
            eid = self._ids[0]
            if self._in_flight(eid) or c.sub is not None and c.sub.find(eid) >= 0:
                self.cursor = eid
                continue
            if self._load(eid) < 0:
                self.cursor = eid
                continue
            if not self._publish(eid):
                break
            self.cursor = eid
            sent += 1
        if qos0 and sent:
            self.count[_QOS0_PING] = c.ping()

    def _on_ack(self, pid, code, reason):
        i = self._slot(pid)
        if i < 0:
            log("ack for unknown packet id %d (code 0x%02x)" % (pid, code & 0xFF))
            return
        eid = self._eid[i]
        self._eid[i] = -1
        if self.client.sub is not None and (code >= 0x80 or code == SESSION_LOST or
                                            code == _NO_MATCHING_SUBSCRIBERS and self.require_subscribers):
            self.client.sub.discard(eid)    # not delivered: sent again (or discarded) as without e2e acks
        if code == SESSION_LOST:
            self.cursor = -1        # the broker forgot it: send it again
            return
        if code == _NO_MATCHING_SUBSCRIBERS and self.require_subscribers:
            self.count[_UNHEARD] += 1
            self._retry_later()
            if self.count[_UNHEARD] == 1 or self.count[_UNHEARD] % 100 == 0:
                log("PUBACK 0x10 No matching subscribers for batch %d: kept, sent again later (%d so far)"
                    % (eid, self.count[_UNHEARD]))
            return
        if code < 0x80:
            self.backoff_n = 0          # the link carries data: reconnect promptly next time
            self.hold_n = 0
            if self.client.sub is not None and self.client.sub.ack(eid):
                return                  # it stays, awaiting its e2e ack (mqb_e2e)
            n = self.outbox.records(eid)
            if self.outbox.ack(eid) == 0:
                self.count[_ACKED_BATCHES] += 1
                self.count[_ACKED_RECORDS] += n
            return
        self.count[_LAST_ERROR] = code
        self.count[_REFUSED_BATCHES] += 1
        if code in _TRANSIENT:
            self._retry_later()
            log("broker refused batch %d with 0x%02x %s (%s): kept, retried later"
                % (eid, code, P.reason_name(code), reason))
        else:
            n = self.outbox.records(eid)
            self.outbox.discard(eid)
            log("broker refused batch %d with 0x%02x %s (%s): discarded, %d records counted dropped"
                % (eid, code, P.reason_name(code), reason, n))

    def _retry_later(self):
        """Send every pending batch again, from the oldest, after a pause that doubles
        with each refusal in a row (up to backoff.max_ms): a broker that keeps answering
        0x10 or 0x97 is not flooded with resends."""
        self.cursor = -1
        delay = self.ms[_MS_BACKOFF] << min(self.hold_n, 16)
        self.at[_AT_HOLD] = time.ticks_add(time.ticks_ms(), min(delay, self.ms[_MS_BACKOFF_MAX]))
        self.hold_n += 1

    def _network(self, now):
        c = self.client
        if not c.connected:
            if time.ticks_diff(now, self.at[_AT_CONNECT]) >= 0:
                self._connect(now)
            return
        try:
            c.service()
            self._drain(now)
        except (MQTTError, TransportError) as e:
            self._failed(e, now)
