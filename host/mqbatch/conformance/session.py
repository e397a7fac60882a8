"""Session and batch rules over the packets of MQTT 5.0 connections (no I/O).

`Checker` is fed every whole packet of every connection, in order, with its direction
("c2s" client to server, "s2c" server to client) and arrival time; it parses each with
mqbatch.conformance.packets and records `Violation`s. One rule id per requirement (the
MQTT 5.0 statement ids in brackets; the rows of mqbatch.conformance.requirements):

- per packet: header, VBIs, UTF-8, properties, packet ids, reason codes, MQTT version;
- MQTT-MAX-PACKET-SIZE: exact size against the peer's Maximum Packet Size [3.2.2-15];
- MQTT-TOPIC-ALIAS: above the peer's Topic Alias Maximum, or used before it was defined
  on this connection [3.3.2-9, 3.2.2-17, 3.2.2-18]; MQTT-TOPIC-ALIAS-0 [3.3.2-8];
- MQTT-SUB-ID: a Subscription Identifier in a client PUBLISH [3.3.4-6];
- MQTT-RECEIVE-MAX: unacknowledged QoS 1/2 PUBLISHes above the server's Receive Maximum
  [3.3.4-7, 4.9.0-2]; MQTT-PID-REUSE: a new message on an id still open [2.2.1-3, 4.3.2-1];
- MQTT-DUP: DUP=1 on a first transmission [4.3.2-2, 4.3.3-2]; MQTT-DUP-RESEND: a resend
  (same id, same payload) without DUP [3.3.1-1];
- MQTT-RESEND: a resumed session ended by the client before what it left open was resent
  [4.4.0-1]; MQTT-RESEND-ORDER: resends out of their original order [4.6.0-1];
- MQTT-SESSION: messages of a discarded session resent into a new one (Clean Start 1 or
  Session Present 0) [3.1.2-4, 3.2.2-5];
- MQTT-PUBREL: a PUBREC (< 0x80) left without PUBREL while the client ends its connection,
  or the PUBLISH resent after its PUBREL [4.3.3-4, 4.3.3-6];
- MQTT-KEEPALIVE: more than 1.5 x the Keep Alive in force (the Server Keep Alive when the
  CONNACK has one) without a client packet [3.1.2-20, 3.1.2-21, 3.1.2-22];
- MQTT-MAX-QOS [3.2.2-11], MQTT-RETAIN [3.2.2-14], MQTT-AFTER-DISCONNECT [3.14.4-1],
  MQTT-FIRST-CONNECT (the first client packet is CONNECT, and only once) [3.1.0-1, 3.1.0-2];
- per batch (a client PUBLISH on a topic matching `batch_topics`): mqbatch.conformance.batchrules.

`applied` counts how often each rule was really exercised, so a verdict can tell PASS from
"never tried": e.g. MQTT-RETAIN counts only once the publisher has shown it retains (a
retained PUBLISH or a Will Retain) and is then under Retain Available 0.

Unacknowledged message ids survive a connection per client identifier, so a resend on the
next connection is checked against what was really left open.
"""

from __future__ import annotations

import dataclasses
import hashlib

from mqbatch.conformance import batchrules
from mqbatch.conformance import packets as W

C2S, S2C = "c2s", "s2c"
NO_LIMIT = 268_435_460
PUBREL_WAIT_S = 3.0  # a PUBREC still unanswered this long when the connection ends: MQTT-PUBREL


@dataclasses.dataclass
class Violation:
    rule: str
    conn: int
    direction: str
    index: int  # packet number within the connection, from 0
    packet: str  # packet summary
    text: str

    def __str__(self):
        return f"[{self.rule}] conn {self.conn} {self.direction} #{self.index} {self.packet}: {self.text}"


def topic_matches(flt: str, topic: str) -> bool:
    f, t = flt.split("/"), topic.split("/")
    for i, part in enumerate(f):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(f) == len(t)


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


@dataclasses.dataclass
class _Side:
    """What one direction's sender must respect (limits set by the peer) and its state."""

    max_packet: int = NO_LIMIT
    alias_max: int = 0
    receive_max: int = 65535
    max_qos: int = 2
    retain: bool = True
    aliases: dict = dataclasses.field(default_factory=dict)
    inflight: dict = dataclasses.field(default_factory=dict)  # pid -> "ack" | "rel", in send order
    digests: dict = dataclasses.field(default_factory=dict)  # pid -> digest of the open message
    sizes: dict = dataclasses.field(default_factory=dict)  # pid -> size of the open PUBLISH
    resend_order: list = dataclasses.field(default_factory=list)  # pids open at the resume, in order
    releasable: set = dataclasses.field(default_factory=set)  # QoS 2 pids past PUBREC at the resume
    discarded: set = dataclasses.field(default_factory=set)  # pids of a session the server did not keep
    pubrec_at: dict = dataclasses.field(default_factory=dict)  # pid -> time its PUBREC reached the client
    peak: int = 0


class Connection:
    def __init__(self, checker: "Checker", number: int):
        self.checker = checker
        self.number = number
        self.client_id: str | None = None
        self.index = 0
        self.side = {C2S: _Side(), S2C: _Side()}
        self.disconnected = False
        self.connected = False  # a CONNECT was seen
        self.connack_seen = False
        self.accepted = False  # CONNACK < 0x80
        self.resumed = False
        self.clean_start = True
        self.keepalive = 0  # in force (Server Keep Alive if the CONNACK has one), seconds
        self.last_c2s: float | None = None
        self.closed = False
        self.foreign = False  # the client spoke another protocol than MQTT 5

    def _bad(self, direction, i, pkt_summary):
        def bad(rule, text):
            self.checker.violations.append(Violation(rule, self.number, direction, i, pkt_summary, text))

        return bad

    def feed(self, direction: str, raw: bytes, t: float = 0.0) -> W.Packet:
        pkt = W.parse(raw)
        i = self.index
        self.index += 1
        bad = self._bad(direction, i, pkt.summary() if pkt.complete else f"{pkt.name} {len(raw)}B")
        ck = self.checker
        ck.apply(direction, "MQTT-PACKET")
        for rule, text in pkt.violations:
            bad(rule, text)
        if direction == C2S:
            self._c2s_timing(t, bad)
            if self.disconnected:
                bad("MQTT-AFTER-DISCONNECT", "the client sent this after its DISCONNECT [MQTT-3.14.4-1]")
            ck.apply(C2S, "MQTT-FIRST-CONNECT")
            if pkt.type == W.CONNECT and self.connected:
                bad("MQTT-FIRST-CONNECT", "a second CONNECT on this connection [MQTT-3.1.0-2]")
            elif pkt.type != W.CONNECT and not self.connected:
                bad("MQTT-FIRST-CONNECT", f"{pkt.name} before CONNECT [MQTT-3.1.0-1]")
            if pkt.type == W.CONNECT:
                self.connected = True
        me, peer = self.side[direction], self.side[S2C if direction == C2S else C2S]
        if me.max_packet < NO_LIMIT:
            ck.apply(direction, "MQTT-MAX-PACKET-SIZE")
        if len(raw) > me.max_packet:
            bad(
                "MQTT-MAX-PACKET-SIZE",
                f"{len(raw)} bytes > the peer's Maximum Packet Size {me.max_packet} [MQTT-3.2.2-15]",
            )
        if not pkt.complete:
            if any(r == "MQTT-VERSION" for r, _ in pkt.violations):
                self.foreign = True  # not MQTT 5: the proxy relays the rest unparsed
            return pkt  # fields may be missing: no session rules
        tp = pkt.type
        if tp == W.CONNECT:
            self._connect(pkt)
        elif tp == W.CONNACK:
            self._connack(pkt)
        elif tp == W.PUBLISH:
            self._publish(pkt, direction, me, bad)
        elif tp in (W.PUBACK, W.PUBREC, W.PUBCOMP):
            pid = pkt.fields["pid"]
            st = peer.inflight.get(pid)
            if st is not None and (tp in (W.PUBACK, W.PUBCOMP) or pkt.fields["reason"] >= 0x80):
                del peer.inflight[pid]
                peer.digests.pop(pid, None)
                peer.pubrec_at.pop(pid, None)
            elif st is not None and tp == W.PUBREC:
                peer.inflight[pid] = "rel"
                peer.pubrec_at[pid] = t
        elif tp == W.PUBREL:
            pid = pkt.fields["pid"]
            if pid in me.pubrec_at or pid in me.releasable:
                ck.apply(direction, "MQTT-PUBREL")
            me.releasable.discard(pid)
            me.pubrec_at.pop(pid, None)
            if direction == C2S and pid in me.discarded:
                bad(
                    "MQTT-SESSION",
                    f"PUBREL for packet id {pid} of a session the server did not keep "
                    f"(Clean Start {int(self.clean_start)}, Session Present 0) [MQTT-3.2.2-5]",
                )
        elif tp == W.DISCONNECT and direction == C2S:
            self.disconnected = True
            ck.apply(C2S, "MQTT-AFTER-DISCONNECT")
            self._client_ends(bad, t, "DISCONNECT")
        if self.closed:  # sent as the connection was cut: part of the client's session all the same
            self._save()
        return pkt

    def _c2s_timing(self, t: float, bad) -> None:
        if self.accepted and self.keepalive and self.last_c2s is not None:
            self.checker.apply(C2S, "MQTT-KEEPALIVE")
            gap = t - self.last_c2s
            if gap > 1.5 * self.keepalive:
                bad(
                    "MQTT-KEEPALIVE",
                    f"{gap:.1f} s without a client packet; Keep Alive in force {self.keepalive} s "
                    f"[MQTT-3.1.2-20, MQTT-3.1.2-21]",
                )
        self.last_c2s = t

    def _client_ends(self, bad, t: float, how: str) -> None:
        """The client ends its connection (DISCONNECT, or closes it): what it had to send first."""
        me = self.side[C2S]
        if self.resumed:
            self.checker.apply(C2S, "MQTT-RESEND")
        if me.resend_order or me.releasable:
            bad(
                "MQTT-RESEND",
                f"{how} while messages left open by the resumed session were never resent "
                f"(PUBLISH ids {me.resend_order}, PUBREL ids {sorted(me.releasable)}) [MQTT-4.4.0-1]",
            )
        late = sorted(p for p, at in me.pubrec_at.items() if p not in me.releasable and t - at >= PUBREL_WAIT_S)
        if me.pubrec_at:
            self.checker.apply(C2S, "MQTT-PUBREL")
        if late:
            bad(
                "MQTT-PUBREL",
                f"{how} with no PUBREL for packet ids {late}, whose PUBREC came >= {PUBREL_WAIT_S:.0f} s "
                f"before [MQTT-4.3.3-4]",
            )

    def _connect(self, pkt):
        f = pkt.fields
        self.client_id = f["client_id"] or None
        self.clean_start = f["clean_start"]
        self.keepalive = f["keepalive"]
        if f["will"] and f["will_retain"]:
            self.checker.retain_wanted = True
        s2c = self.side[S2C]  # the server must respect what the client announced
        s2c.max_packet = pkt.props.get(0x27, s2c.max_packet)
        s2c.alias_max = pkt.props.get(0x22, 0)
        s2c.receive_max = pkt.props.get(0x21, 65535)

    def _connack(self, pkt):
        self.connack_seen = True
        self.accepted = pkt.fields["reason"] < 0x80
        c2s = self.side[C2S]
        c2s.max_packet = pkt.props.get(0x27, c2s.max_packet)
        c2s.alias_max = pkt.props.get(0x22, 0)
        c2s.receive_max = pkt.props.get(0x21, 65535)
        c2s.max_qos = pkt.props.get(0x24, 2)
        c2s.retain = bool(pkt.props.get(0x25, 1))
        self.keepalive = pkt.props.get(0x13, self.keepalive)
        if 0x12 in pkt.props:
            self.client_id = pkt.props[0x12]
        store = self.checker.sessions
        saved = store.get(self.client_id, {C2S: {}, S2C: {}, "digests": {}})
        kept = pkt.fields["session_present"] and self.accepted
        if not kept:
            c2s.discarded = {p for p, st in saved[C2S].items()}
            if c2s.discarded:
                self.checker.apply(C2S, "MQTT-SESSION")
            saved = {C2S: {}, S2C: {}, "digests": {}}
        self.resumed = bool(saved[C2S] or saved[S2C])
        for d in (C2S, S2C):
            self.side[d].inflight = dict(saved[d])
            self.side[d].resend_order = [p for p, st in saved[d].items() if st == "ack"]
            self.side[d].releasable = {p for p, st in saved[d].items() if st == "rel"}
        c2s.digests = dict(saved["digests"])
        c2s.sizes = dict(saved.get("sizes", {}))
        # an open message larger than this connection's Maximum Packet Size cannot be resent
        # ([MQTT-3.2.2-15] prevails over [MQTT-4.4.0-1]): the client may give it up
        too_big = [p for p in c2s.resend_order if c2s.sizes.get(p, 0) > c2s.max_packet]
        for p in too_big:
            c2s.resend_order.remove(p)
            c2s.inflight.pop(p, None)

    def _publish(self, pkt, direction, me, bad):
        f = pkt.fields
        topic, alias = f["topic"], f["alias"]
        ck = self.checker
        client = direction == C2S
        if client:
            ck.apply(C2S, "MQTT-SUB-ID")
            if 0x0B in pkt.props:
                bad("MQTT-SUB-ID", "a Subscription Identifier in a client PUBLISH [MQTT-3.3.4-6]")
        if alias is not None:
            ck.apply(direction, "MQTT-TOPIC-ALIAS")
            if alias == 0:
                bad("MQTT-TOPIC-ALIAS-0", "Topic Alias 0 [MQTT-3.3.2-8]")
            elif alias > me.alias_max:
                bad(
                    "MQTT-TOPIC-ALIAS",
                    f"Topic Alias {alias} above the peer's Topic Alias Maximum {me.alias_max} "
                    "[MQTT-3.3.2-9, MQTT-3.2.2-17, MQTT-3.2.2-18]",
                )
            elif topic:
                me.aliases[alias] = topic
            elif alias not in me.aliases:
                bad(
                    "MQTT-TOPIC-ALIAS",
                    f"Topic Alias {alias} used with an empty topic before it was defined on this connection",
                )
            else:
                topic = me.aliases[alias]
        elif not topic:
            bad("MQTT-TOPIC-ALIAS", "empty Topic Name without a Topic Alias")
        if client:
            ck.apply(C2S, "MQTT-TOPIC-ALIAS-0")
        f["resolved_topic"] = topic
        if me.max_qos < 2:
            ck.apply(direction, "MQTT-MAX-QOS")
        if f["retain"] and client:
            ck.retain_wanted = ck.retain_wanted or me.retain
        if not me.retain and ck.retain_wanted:
            ck.apply(direction, "MQTT-RETAIN")
        if f["qos"] > me.max_qos:
            bad("MQTT-MAX-QOS", f"QoS {f['qos']} above the server's Maximum QoS {me.max_qos} [MQTT-3.2.2-11]")
        if f["retain"] and not me.retain:
            bad("MQTT-RETAIN", "RETAIN=1 although the server said Retain Available 0 [MQTT-3.2.2-14]")
        if f["qos"]:
            self._qos_publish(pkt, direction, me, bad)
        batch = any(topic_matches(flt, topic) for flt in ck.batch_topics)
        if client and batch and not (f["retain"] and not f["payload"]):  # a zero-byte retained clear is no batch
            ck.batch_records += batchrules.check(
                pkt, bad, (ck.max_batch_size, ck.max_payload_bytes), lambda r: ck.apply(C2S, r)
            )
            ck.batches += 1

    def _qos_publish(self, pkt, direction, me, bad):
        f, ck = pkt.fields, self.checker
        pid, digest = f["pid"], _digest(f["payload"])
        ck.apply(direction, "MQTT-PID-REUSE")
        ck.apply(direction, "MQTT-DUP")
        if me.receive_max < 65535:
            ck.apply(direction, "MQTT-RECEIVE-MAX")
        at_resume = pid in me.resend_order  # left open by the resumed session, not yet resent
        same = me.digests.get(pid) == digest
        if at_resume:
            ck.apply(direction, "MQTT-DUP-RESEND")
            ck.apply(direction, "MQTT-RESEND-ORDER")
        if me.inflight.get(pid) == "rel" and f["dup"]:
            ck.apply(direction, "MQTT-PUBREL")
            bad("MQTT-PUBREL", f"PUBLISH id {pid} resent after its PUBREL [MQTT-4.3.3-6]")
        elif f["dup"] and pid in me.discarded and pid not in me.inflight:
            ck.apply(direction, "MQTT-SESSION")
            bad(
                "MQTT-SESSION",
                f"DUP resend of packet id {pid} into a new session (Clean Start {int(self.clean_start)}, "
                f"Session Present 0): the old session's messages must be discarded [MQTT-3.1.2-4, MQTT-3.2.2-5]",
            )
        elif at_resume:
            if f["dup"] and not same:
                bad(
                    "MQTT-RESEND",
                    f"DUP=1 on packet id {pid} with another payload than the message left open under it: "
                    f"not a resend of it [MQTT-4.4.0-1]",
                )
            if not f["dup"] and same:
                bad("MQTT-DUP-RESEND", f"packet id {pid} resent without DUP=1 [MQTT-3.3.1-1]")
            elif not f["dup"]:
                bad("MQTT-PID-REUSE", f"packet id {pid} reused for a new message while still unacknowledged")
            if me.resend_order[0] != pid:
                bad(
                    "MQTT-RESEND-ORDER",
                    f"packet id {pid} resent before {me.resend_order[: me.resend_order.index(pid)]}, "
                    f"sent before it [MQTT-4.6.0-1]",
                )
            me.resend_order.remove(pid)
        elif f["dup"]:
            bad(
                "MQTT-DUP",
                f"DUP=1 on packet id {pid}, not a resend after a Session Present resume "
                f"[MQTT-4.3.2-2, MQTT-4.3.3-2, MQTT-4.4.0-1]",
            )
        elif pid in me.inflight:
            bad("MQTT-PID-REUSE", f"packet id {pid} reused while still unacknowledged [MQTT-2.2.1-3]")
        me.discarded.discard(pid)
        if me.inflight.get(pid) != "rel":
            me.inflight[pid] = "ack"
        me.digests[pid] = digest
        me.sizes[pid] = len(pkt.raw)
        me.peak = max(me.peak, len(me.inflight))
        ck.peak[direction] = max(ck.peak.get(direction, (0, 0)), (len(me.inflight), me.receive_max))
        if len(me.inflight) > me.receive_max:
            bad(
                "MQTT-RECEIVE-MAX",
                f"{len(me.inflight)} QoS 1/2 PUBLISHes unacknowledged > the peer's Receive Maximum "
                f"{me.receive_max} [MQTT-3.3.4-7]",
            )

    def close(self, t: float | None = None, by_client: bool = False):
        """The connection ended at time t; by_client: the client closed it (or sent DISCONNECT)."""
        if self.closed:
            return
        self.closed = True
        if t is not None and self.accepted:
            bad = self._bad(C2S, self.index, "(connection end)")
            if by_client and not self.disconnected:
                self._client_ends(bad, t, "connection closed by the client")
            if self.keepalive and self.last_c2s is not None and t - self.last_c2s > 1.5 * self.keepalive:
                self.checker.apply(C2S, "MQTT-KEEPALIVE")
                bad(
                    "MQTT-KEEPALIVE",
                    f"{t - self.last_c2s:.1f} s without a client packet before the connection ended; Keep Alive "
                    f"in force {self.keepalive} s [MQTT-3.1.2-20, MQTT-3.1.2-21]",
                )
        self._save()

    def _save(self) -> None:
        if self.client_id is not None and self.connack_seen:
            self.checker.sessions[self.client_id] = {
                C2S: dict(self.side[C2S].inflight),
                S2C: dict(self.side[S2C].inflight),
                "digests": dict(self.side[C2S].digests),
                "sizes": dict(self.side[C2S].sizes),
            }


class Checker:
    def __init__(self, batch_topics=("#",), max_batch_size: int = 100, max_payload_bytes: int = 65536):
        self.batch_topics = tuple(batch_topics)
        self.max_batch_size = max_batch_size
        self.max_payload_bytes = max_payload_bytes
        self.violations: list[Violation] = []
        self.sessions: dict[str, dict] = {}
        self.batches = 0
        self.batch_records = 0
        self.retain_wanted = False  # the publisher has shown it retains (PUBLISH or Will)
        self.applied: dict[tuple[str, str], int] = {}  # (direction, rule) -> times the rule was exercised
        self.peak: dict[str, tuple[int, int]] = {}  # direction -> (most unacknowledged, Receive Maximum then)

    def apply(self, direction: str, rule: str) -> None:
        k = (direction, rule)
        self.applied[k] = self.applied.get(k, 0) + 1

    def connection(self, number: int) -> Connection:
        return Connection(self, number)
