"""Session and batch rules over the packets of MQTT 5.0 connections (no I/O).

`Checker` is fed every whole packet of every connection, in order, with its
direction ("c2s" client to server, "s2c" server to client); it parses each with
mqbatch.conformance.packets and records `Violation`s:

- per packet: the rules of conformance_wire (header, VBIs, UTF-8, properties, ids);
- per connection: MQTT-MAX-PACKET-SIZE (exact size, Remaining Length bytes included,
  against the peer's Maximum Packet Size), MQTT-TOPIC-ALIAS (0, above the peer's
  Topic Alias Maximum, used before it was defined on this connection),
  MQTT-RECEIVE-MAX (unacknowledged QoS 1/2 PUBLISHes above the peer's Receive
  Maximum), MQTT-PID-REUSE (a new PUBLISH with an id still unacknowledged),
  MQTT-DUP (DUP=1 other than on the resend, after a Session Present resume, of a
  message left unacknowledged), MQTT-RESEND (a client that ends a resumed session
  with DISCONNECT without having resent what it left open: PUBLISH with DUP, or
  PUBREL [MQTT-4.4.0-1]), MQTT-MAX-QOS / MQTT-RETAIN (a PUBLISH above the
  server's Maximum QoS, RETAIN=1 with Retain Available 0), MQTT-AFTER-DISCONNECT (a packet after the client's
  DISCONNECT);
- per batch (a client's PUBLISH on a topic matching `batch_topics`): BATCH-FORMAT,
  BATCH-SIZE (each User Property exactly once, v1, positive integer), BATCH-COUNT
  (batch-size equals the sub-messages in the payload, which parses to its end),
  BATCH-LIMITS (count and payload within the configured limits).

Unacknowledged message ids survive a connection per client identifier, so a DUP
resend on the next connection is checked against what was really left open.
"""

from __future__ import annotations

import dataclasses
import re

from mqbatch.conformance import packets as W

C2S, S2C = "c2s", "s2c"
_BATCH_SIZE = re.compile(r"[1-9][0-9]*")


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


@dataclasses.dataclass
class _Side:
    """What one direction's sender must respect (limits set by the peer) and its state."""

    max_packet: int = 268_435_460
    alias_max: int = 0
    receive_max: int = 65535
    max_qos: int = 2
    retain: bool = True
    aliases: dict = dataclasses.field(default_factory=dict)
    inflight: dict = dataclasses.field(default_factory=dict)  # pid -> "ack" | "rel"
    resendable: set = dataclasses.field(default_factory=set)  # pids open when the session was resumed
    releasable: set = dataclasses.field(default_factory=set)  # QoS 2 pids past PUBREC at the resume
    peak: int = 0  # most unacknowledged at once


class Connection:
    def __init__(self, checker: "Checker", number: int):
        self.checker = checker
        self.number = number
        self.client_id: str | None = None
        self.index = 0
        self.side = {C2S: _Side(), S2C: _Side()}
        self.disconnected = False
        self.connack_seen = False
        self.resumed = False

    def feed(self, direction: str, raw: bytes) -> W.Packet:
        pkt = W.parse(raw)
        i = self.index
        self.index += 1
        out = self.checker.violations

        def bad(rule, text):
            out.append(Violation(rule, self.number, direction, i, pkt.summary(), text))

        self.checker.apply(direction, "MQTT-PACKET")
        for rule, text in pkt.violations:
            bad(rule, text)
        if direction == C2S and self.disconnected:
            bad("MQTT-AFTER-DISCONNECT", "the client sent this after its DISCONNECT")
        me, peer = self.side[direction], self.side[S2C if direction == C2S else C2S]
        if me.max_packet < 268_435_460:
            self.checker.apply(direction, "MQTT-MAX-PACKET-SIZE")
        if pkt.size > me.max_packet:
            bad("MQTT-MAX-PACKET-SIZE", f"{pkt.size} bytes > the peer's Maximum Packet Size {me.max_packet}")
        if pkt.violations and any(r in ("MQTT-MALFORMED", "MQTT-VBI") for r, _ in pkt.violations):
            return pkt  # fields may be incomplete: no session rules
        t = pkt.type
        if t == W.CONNECT:
            self._connect(pkt)
        elif t == W.CONNACK:
            self._connack(pkt)
        elif t == W.PUBLISH:
            self._publish(pkt, direction, me, bad)
        elif t in (W.PUBACK, W.PUBREC, W.PUBCOMP):
            pid = pkt.fields["pid"]
            st = peer.inflight.get(pid)
            if st is not None and (t == W.PUBACK or t == W.PUBCOMP or pkt.fields["reason"] >= 0x80):
                del peer.inflight[pid]
            elif st is not None and t == W.PUBREC:
                peer.inflight[pid] = "rel"
        elif t == W.PUBREL:
            me.releasable.discard(pkt.fields["pid"])
        elif t == W.DISCONNECT and direction == C2S:
            self.disconnected = True
            self.checker.apply(direction, "MQTT-AFTER-DISCONNECT")
            if self.resumed:
                self.checker.apply(direction, "MQTT-RESEND")
            if me.resendable or me.releasable:
                bad(
                    "MQTT-RESEND",
                    f"DISCONNECT while messages left open by the resumed session were never resent "
                    f"(PUBLISH ids {sorted(me.resendable)}, PUBREL ids {sorted(me.releasable)}) "
                    f"[MQTT-4.4.0-1]",
                )
        return pkt

    def _connect(self, pkt):
        f = pkt.fields
        self.client_id = f["client_id"] or None
        self.clean_start = f["clean_start"]
        s2c = self.side[S2C]  # the server must respect what the client announced
        s2c.max_packet = pkt.props.get(0x27, s2c.max_packet)
        s2c.alias_max = pkt.props.get(0x22, 0)
        s2c.receive_max = pkt.props.get(0x21, 65535)

    def _connack(self, pkt):
        self.connack_seen = True
        c2s = self.side[C2S]
        c2s.max_packet = pkt.props.get(0x27, c2s.max_packet)
        c2s.alias_max = pkt.props.get(0x22, 0)
        c2s.receive_max = pkt.props.get(0x21, 65535)
        c2s.max_qos = pkt.props.get(0x24, 2)
        c2s.retain = bool(pkt.props.get(0x25, 1))
        if pkt.fields["reason"] < 0x80:  # a session under these limits: every PUBLISH on it is checked
            if c2s.max_qos < 2:
                self.checker.apply(C2S, "MQTT-MAX-QOS")
            if not c2s.retain:
                self.checker.apply(C2S, "MQTT-RETAIN")
        if 0x12 in pkt.props:
            self.client_id = pkt.props[0x12]
        store = self.checker.sessions
        saved = store.get(self.client_id, {C2S: {}, S2C: {}})
        if not pkt.fields["session_present"] or pkt.fields["reason"] >= 0x80:
            saved = {C2S: {}, S2C: {}}
        self.resumed = bool(saved[C2S] or saved[S2C])
        for d in (C2S, S2C):
            self.side[d].inflight = dict(saved[d])
            self.side[d].resendable = {p for p, st in saved[d].items() if st == "ack"}
            self.side[d].releasable = {p for p, st in saved[d].items() if st == "rel"}

    def _publish(self, pkt, direction, me, bad):
        f = pkt.fields
        topic, alias = f["topic"], f["alias"]
        ck = self.checker
        if alias is not None:
            ck.apply(direction, "MQTT-TOPIC-ALIAS")
            if alias == 0 or alias > me.alias_max:
                bad(
                    "MQTT-TOPIC-ALIAS",
                    f"Topic Alias {alias} outside 1..{me.alias_max} (the peer's Topic Alias Maximum)",
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
        f["resolved_topic"] = topic
        if me.max_qos < 2:
            ck.apply(direction, "MQTT-MAX-QOS")
        if not me.retain:
            ck.apply(direction, "MQTT-RETAIN")
        if f["qos"] > me.max_qos:
            bad("MQTT-MAX-QOS", f"QoS {f['qos']} above the server's Maximum QoS {me.max_qos}")
        if f["retain"] and not me.retain:
            bad("MQTT-RETAIN", "RETAIN=1 although the server said Retain Available 0")
        if f["qos"]:
            pid = f["pid"]
            ck.apply(direction, "MQTT-PID-REUSE")
            if me.receive_max < 65535:
                ck.apply(direction, "MQTT-RECEIVE-MAX")
            if f["dup"]:
                ck.apply(direction, "MQTT-DUP")
                if pid in me.resendable:
                    me.resendable.discard(pid)
                else:
                    bad(
                        "MQTT-DUP",
                        f"DUP=1 on packet id {pid}, which was not left unacknowledged by a resumed "
                        f"session (a message may be resent only after Session Present 1)",
                    )
            elif pid in me.inflight:
                bad("MQTT-PID-REUSE", f"packet id {pid} reused while still unacknowledged")
            me.inflight[pid] = "ack"
            me.peak = max(me.peak, len(me.inflight))
            ck.peak[direction] = max(ck.peak.get(direction, (0, 0)), (len(me.inflight), me.receive_max))
            if len(me.inflight) > me.receive_max:
                bad(
                    "MQTT-RECEIVE-MAX",
                    f"{len(me.inflight)} QoS 1/2 PUBLISHes unacknowledged > the peer's "
                    f"Receive Maximum {me.receive_max}",
                )
        if (
            direction == C2S
            and pkt.fields["payload"]
            and any(topic_matches(flt, topic) for flt in self.checker.batch_topics)
        ):
            self._batch(pkt, bad)

    def _batch(self, pkt, bad):
        lim = self.checker
        formats = [v for k, v in pkt.user_props if k == "batch-format"]
        sizes = [v for k, v in pkt.user_props if k == "batch-size"]
        if formats != ["v1"]:
            bad("BATCH-FORMAT", f"batch-format User Property {formats} (must be present once, 'v1')")
        if len(sizes) != 1 or not _BATCH_SIZE.fullmatch(sizes[0]):
            bad("BATCH-SIZE", f"batch-size User Property {sizes} (must be present once, a positive integer)")
            return
        payload = pkt.fields["payload"]
        count, problem = W.batch_payload_count(payload)
        if problem or count != int(sizes[0]):
            bad(
                "BATCH-COUNT",
                f"batch-size {sizes[0]} but the payload holds {count} sub-messages"
                + (f" and then: {problem}" if problem else ""),
            )
        if count > lim.max_batch_size or len(payload) > lim.max_payload_bytes:
            bad(
                "BATCH-LIMITS",
                f"{count} sub-messages, {len(payload)} payload bytes: above the configured "
                f"{lim.max_batch_size} / {lim.max_payload_bytes}",
            )
        lim.apply(C2S, "BATCH")
        lim.batches += 1
        lim.batch_records += count

    def close(self):
        if self.client_id is not None and self.connack_seen:
            self.checker.sessions[self.client_id] = {d: dict(self.side[d].inflight) for d in (C2S, S2C)}


class Checker:
    def __init__(self, batch_topics=("#",), max_batch_size: int = 100, max_payload_bytes: int = 65536):
        self.batch_topics = tuple(batch_topics)
        self.max_batch_size = max_batch_size
        self.max_payload_bytes = max_payload_bytes
        self.violations: list[Violation] = []
        self.sessions: dict[str, dict] = {}
        self.batches = 0
        self.batch_records = 0
        self.applied: dict[tuple[str, str], int] = {}  # (direction, rule) -> times the rule was exercised
        self.peak: dict[str, tuple[int, int]] = {}  # direction -> (most unacknowledged, Receive Maximum then)

    def apply(self, direction: str, rule: str) -> None:
        k = (direction, rule)
        self.applied[k] = self.applied.get(k, 0) + 1

    def connection(self, number: int) -> Connection:
        return Connection(self, number)
