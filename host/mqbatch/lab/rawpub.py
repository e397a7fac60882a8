"""A raw-socket MQTT 5 batch publisher for the conformance harness's self-test (lab).

Written on a bare socket so it can do exactly what the harness asks, including breaking one
rule on purpose: `python -m mqbatch.lab.rawpub [--fault NAME]` (FAULTS below; no fault: a
clean publisher that must PASS every row). It speaks the harness's command protocol
(mqbatch.conformance.publisher: MQBATCH_* environment, `MQBATCH-STORED n`, exit 0 when
every stored record was acknowledged).

Clean behaviour: Clean Start on the first connect and Session Expiry from the environment,
a retained QoS 1 Will (unretained after CONNACK 0x9A, QoS 0 after 0x9B), one retained status message when the server
retains, then batches for MQBATCH_DURATION_S: each built at send time from the records
waiting, sized to land exactly on a limit (alternately the byte budget — min(Maximum Packet
Size, MQBATCH_MAX_BYTES) — and the count MQBATCH_MAX_COUNT) once records pile up; QoS
min(MQBATCH_QOS, Maximum QoS); Topic Alias 1 when the server allows one; at most Receive
Maximum in flight; PINGREQ when idle for half the Keep Alive in force; on a lost link,
reconnect with Clean Start 0 and resend what is open in order with DUP (PUBREL for what
had its PUBREC), or republish it as new if the session was not kept.
"""

from __future__ import annotations

import gzip
import os
import select
import socket
import sys
import time

FAULTS = {
    "silent": "connects to nothing, publishes nothing, exits 0",
    "crash": "exits 1 in the middle of its run, records stored but never sent",
    "lose-records": "reports every record stored but never sends every 5th batch",
    "oversize-1": "its packet budget is 1 byte above the server's Maximum Packet Size",
    "ignore-receive-max": "sends while Receive Maximum PUBLISHes are unacknowledged",
    "no-limits": "batches 1 sub-message and 1 byte above its configured limits",
    "sub-id": "a Subscription Identifier in its PUBLISHes",
    "empty-batch": "one batch PUBLISH with an empty payload",
    "wrong-count": "batch-size one more than the sub-messages",
    "bad-format": "batch-format V1 instead of v1",
    "alias-0": "Topic Alias 0",
    "alias-over": "a Topic Alias although the server allows none",
    "silent-keepalive": "no packet for 2 x the Keep Alive once, then goes on",
    "no-pubrel": "QoS 2: never sends PUBREL",
    "no-dup": "resends without DUP after a resume",
    "dup-first": "DUP=1 on first transmissions",
    "no-resend": "after a resume, does not resend what is open",
    "resend-reverse": "resends in reverse order after a resume",
    "clean-start-resend": "reconnects with Clean Start 1 and resends with DUP into the new session",
    "keep-lost-session": "after Session Present 0 it resends what was open with DUP, as if the session were kept",
    "pid-reuse": "a new message on a Packet Identifier still unacknowledged",
    "qos-over": "ignores the server's Maximum QoS",
    "retain-anyway": "retains its status message although Retain Available is 0",
    "after-disconnect": "a PINGREQ after its DISCONNECT",
    "mqtt311": "speaks MQTT 3.1.1 (CONNECT level 4)",
    "reason-code": "DISCONNECT with Reason Code 0x05 (not defined)",
    "first-not-connect": "a PINGREQ before its first CONNECT",
    "bad-utf8": "a User Property value that is not UTF-8",
    "truncated": "its last packet cut in the middle, then the connection closed",
    "unknown-prop": "a PUBLISH with property identifier 0x7f (not defined)",
    "compress-userprop": "gzip batches signalled by a User Property, not Content Type",
    "qos0-dup": "a QoS 0 PUBLISH with DUP=1",
}


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        n, c = n >> 7, n & 0x7F
        out.append(c | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s16(b: bytes) -> bytes:
    return len(b).to_bytes(2, "big") + b


def pkt(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def up(k: str, v: bytes | str) -> bytes:
    return b"\x26" + s16(k.encode()) + s16(v if isinstance(v, bytes) else v.encode())


class Link(Exception):
    pass


class Pub:
    def __init__(self, env, fault: str | None):
        self.f = fault
        self.host, self.port = env["MQBATCH_HOST"], int(env["MQBATCH_PORT"])
        self.topic = env["MQBATCH_TOPIC"].encode()
        self.cid = env.get("MQBATCH_CLIENT_ID", "rawpub").encode()
        self.want_qos = int(env.get("MQBATCH_QOS", "1"))
        self.duration = float(env.get("MQBATCH_DURATION_S", "4"))
        self.expiry = int(env.get("MQBATCH_SESSION_EXPIRY_S", "300"))
        self.max_count = int(env.get("MQBATCH_MAX_COUNT", "100"))
        self.max_bytes = int(env.get("MQBATCH_MAX_BYTES", "65536"))
        self.ask_keepalive = int(env.get("MQBATCH_KEEPALIVE_S", "10"))
        self.next_rec = 0
        self.waiting: list[int] = []  # record ids not yet in a batch
        self.first_wait = 0.0
        self.stored = 0
        self.inflight: dict[int, list] = {}  # pid -> [state "ack"|"rel", raw PUBLISH, n records], send order
        self.pid = 0
        self.batches = 0
        self.will_retain = True
        self.will_qos = 1
        self.connects = 0
        self.sock: socket.socket | None = None
        self.buf = b""
        self.faulted: set[str] = set()

    # -- connection ----------------------------------------------------------------
    def connect(self) -> None:
        s = socket.create_connection((self.host, self.port), timeout=5)
        s.settimeout(None)
        self.sock, self.buf = s, b""
        if self.f == "first-not-connect" and "fnc" not in self.faulted:
            self.faulted.add("fnc")
            s.sendall(b"\xc0\x00")
        clean = self.connects == 0 or (self.f == "clean-start-resend" and bool(self.inflight))
        self.connects += 1
        if self.f == "mqtt311":
            body = s16(b"MQTT") + bytes([4, 0x02]) + (30).to_bytes(2, "big") + s16(self.cid)
            s.sendall(pkt(0x10, body))
        else:
            props = b"\x11" + self.expiry.to_bytes(4, "big")
            flags = (0x02 if clean else 0) | 0x04 | (self.will_qos << 3)  # Will
            if self.will_retain:
                flags |= 0x20
            will = b"\x00" + s16(self.topic.rsplit(b"/", 1)[0] + b"/status") + s16(b"offline")
            body = s16(b"MQTT") + bytes([5, flags]) + self.ask_keepalive.to_bytes(2, "big") + vbi(len(props)) + props
            s.sendall(pkt(0x10, body + s16(self.cid) + will))
        self.last_sent = time.monotonic()
        first, body = self.read(5.0)
        if first >> 4 != 2:
            raise Link("no CONNACK")
        present, reason = body[0] & 1, body[1]
        p = {} if self.f == "mqtt311" else self.props(body[2:])
        if reason == 0x9A and self.will_retain:
            self.will_retain = False
            raise Link("Will Retain refused")
        if reason == 0x9B and self.will_qos:
            self.will_qos = 0
            raise Link("Will QoS refused")
        if reason >= 0x80:
            raise Link(f"CONNACK 0x{reason:02x}")
        self.max_packet = p.get(0x27, 1 << 28)
        self.receive_max = p.get(0x21, 65535)
        self.alias_max = p.get(0x22, 0)
        self.qos = self.want_qos if self.f == "qos-over" else min(self.want_qos, p.get(0x24, 2))
        self.retain_ok = p.get(0x25, 1) == 1
        self.keepalive = p.get(0x13, self.ask_keepalive)
        self.alias_set = False
        # Topic Alias only without a Maximum Packet Size: a resend on a new connection carries the
        # whole topic again, and must still fit the batch that was sized to land exactly on the limit
        self.use_alias = self.f == "alias-over" or (self.alias_max >= 1 and 0x27 not in p)
        if not present or self.f == "clean-start-resend" and clean:
            if self.f in ("clean-start-resend", "keep-lost-session"):
                self.resend(order=list(self.inflight))
                return
            for pid, (_, _, recs) in list(self.inflight.items()):  # the session is gone: republish as new
                self.waiting[:0] = recs
                del self.inflight[pid]
            return
        for pid, (_, raw, recs) in list(self.inflight.items()):  # too large for this connection: given up,
            if len(raw) > self.max_packet and self.f != "oversize-1":  # its records republished as new
                self.waiting[:0] = recs
                del self.inflight[pid]
        order = list(self.inflight)
        if self.f == "resend-reverse":
            order.reverse()
        if self.f != "no-resend":
            self.resend(order)

    def resend(self, order) -> None:
        for pid in order:
            st, raw, _ = self.inflight[pid]
            if st == "rel":
                self.send(pkt(0x62, pid.to_bytes(2, "big")))
            else:
                self.send(raw if self.f == "no-dup" else bytes([raw[0] | 0x08]) + raw[1:])

    @staticmethod
    def props(b: bytes) -> dict:
        n, p, shift = 0, 0, 0
        while True:
            c = b[p]
            n |= (c & 0x7F) << shift
            p += 1
            shift += 7
            if not c & 0x80:
                break
        end, out = p + n, {}
        sizes = {0x11: 4, 0x21: 2, 0x22: 2, 0x13: 2, 0x24: 1, 0x25: 1, 0x27: 4, 0x28: 1, 0x29: 1, 0x2A: 1}
        while p < end:
            pid = b[p]
            p += 1
            if pid in sizes:
                out[pid] = int.from_bytes(b[p : p + sizes[pid]], "big")
                p += sizes[pid]
            elif pid == 0x26:
                p += 2 + int.from_bytes(b[p : p + 2], "big")
                p += 2 + int.from_bytes(b[p : p + 2], "big")
            else:  # strings: Assigned Client Identifier, Reason String, ...
                p += 2 + int.from_bytes(b[p : p + 2], "big")
        return out

    def read(self, timeout: float) -> tuple[int, bytes]:
        end = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 2:
                n, p, shift = 0, 1, 0
                while p < len(self.buf):
                    c = self.buf[p]
                    n |= (c & 0x7F) << shift
                    p += 1
                    shift += 7
                    if not c & 0x80:
                        break
                else:
                    p = -1
                if p > 0 and len(self.buf) >= p + n:
                    first, body, self.buf = self.buf[0], self.buf[p : p + n], self.buf[p + n :]
                    return first, body
            left = end - time.monotonic()
            if left <= 0:
                return 0, b""
            r, _, _ = select.select([self.sock], [], [], left)
            if r:
                data = self.sock.recv(65536)
                if not data:
                    raise Link("closed by the server")
                self.buf += data

    def send(self, raw: bytes) -> None:
        try:
            self.sock.sendall(raw)
        except OSError as e:
            raise Link(str(e)) from e
        self.last_sent = time.monotonic()

    # -- batches ---------------------------------------------------------------------
    def publish_raw(self, flags: int, pid: int | None, props: bytes, payload: bytes, alias: bool) -> bytes:
        """alias: use Topic Alias 1 (defined by this connection's first use; no side effect here)."""
        topic = self.topic
        if alias and self.f == "alias-0":
            props = b"\x23\x00\x00" + props
        elif alias and self.use_alias:
            props = b"\x23\x00\x01" + props
            if self.alias_set:
                topic = b""
        if self.f == "sub-id":
            props = b"\x0b\x01" + props
        body = s16(topic) + (pid.to_bytes(2, "big") if pid is not None else b"") + vbi(len(props)) + props
        return pkt(flags, body + payload)

    def build(self, recs: list[int], pad: int, qos: int, pid, alias: bool = True) -> tuple[bytes, bytes]:
        subs = [str(r).encode() + b"." * (pad if i == len(recs) - 1 else 0) for i, r in enumerate(recs)]
        payload = b"".join(vbi(len(x)) + x for x in subs)
        count = len(subs) + (1 if self.f == "wrong-count" else 0)
        props = up("batch-format", "V1" if self.f == "bad-format" else "v1") + up("batch-size", str(count))
        if self.f == "compress-userprop":
            payload = gzip.compress(payload)
            props += up("compression", "gzip")
        if self.f == "bad-utf8" and self.batches == 1:
            props += up("note", b"\xff\xfe")
        flags = 0x30 | (qos << 1)
        return self.publish_raw(flags, pid, props, payload, alias), payload

    def fits(self, recs, pad, qos) -> bool:
        raw, payload = self.build(recs, pad, qos, 1 if qos else None)
        extra = 1 if self.f in ("oversize-1",) else 0
        lim_bytes = self.max_bytes + (1 if self.f == "no-limits" else 0)
        return len(raw) <= self.max_packet + extra and len(payload) <= lim_bytes

    def room(self, recs, qos) -> int:
        """Bytes left under the tighter of the packet and payload budgets with the last record unpadded."""
        raw, payload = self.build(recs, 0, qos, 1 if qos else None)
        extra = 1 if self.f == "oversize-1" else 0
        lim_bytes = self.max_bytes + (1 if self.f == "no-limits" else 0)
        return min(self.max_packet + extra - len(raw), lim_bytes - len(payload))

    def next_batch(self, now: float, force: bool) -> list | None:
        """(records, pad) for the next batch, landing exactly on a limit when records pile up."""
        if not self.waiting:
            return None
        max_count = self.max_count + (1 if self.f == "no-limits" else 0)
        qos = self.qos
        count_mode = self.batches % 4 == 1  # every 4th batch lands on the count limit, the others on bytes
        recs: list[int] = []
        for r in self.waiting:
            if len(recs) >= max_count or not self.fits(recs + [r], 0, qos):
                break
            recs.append(r)
        full = len(recs) >= max_count or len(recs) < len(self.waiting)
        if not full and not force and now - self.first_wait < 0.25:
            return None
        if not recs:
            return None
        pad = 0
        if full and not (count_mode and len(recs) >= max_count):  # fill the byte budget exactly
            pad = max(0, self.room(recs, qos))
            while pad and not self.fits(recs, pad, qos):
                pad -= 1
        return [recs, pad]

    def step(self, now: float, end: float) -> None:
        if now < end:  # records arrive: 10 every 0.1 s
            while self.next_rec < int((now - self.t0) * 100):
                if not self.waiting:
                    self.first_wait = now
                self.waiting.append(self.next_rec)
                self.next_rec += 1
                self.stored += 1
        if self.f == "crash" and now - self.t0 > self.duration / 2:
            print(f"MQBATCH-STORED {self.stored}", flush=True)
            os._exit(1)
        if self.f == "silent-keepalive" and "ka" not in self.faulted and now - self.t0 > 1.0:
            self.faulted.add("ka")
            time.sleep(2.2 * self.keepalive)
            self.send(b"\xc0\x00")
        limit = 10**9 if self.f == "ignore-receive-max" else self.receive_max
        while len(self.inflight) < limit or not self.qos:
            nb = self.next_batch(now, now >= end)
            if nb is None:
                break
            recs, pad = nb
            del self.waiting[: len(recs)]
            if self.waiting:
                self.first_wait = now
            pid = None
            if self.qos:
                pid = self.new_pid()
            raw, _ = self.build(recs, pad, self.qos, pid)
            if self.f == "dup-first" or (self.f == "qos0-dup" and self.batches == 2 and not self.qos):
                raw = bytes([raw[0] | 0x08]) + raw[1:]
            self.batches += 1
            if self.f == "lose-records" and self.batches % 5 == 0:
                continue
            if pid is not None:
                resend, _ = self.build(recs, pad, self.qos, pid, alias=False)  # whole topic: any connection
                self.inflight[pid] = ["ack", resend, recs]
            self.send(raw)
            self.alias_set = self.use_alias
            if self.f == "pid-reuse" and self.batches == 3 and pid is not None:
                extra, _ = self.build([self.next_rec], 0, self.qos, pid)  # a new record, a new message
                self.next_rec += 1
                self.stored += 1
                self.send(extra)  # ... on the same id, still open
        if now - self.last_sent > self.keepalive / 2:
            self.send(b"\xc0\x00")

    def new_pid(self) -> int:
        while True:
            self.pid = self.pid % 65535 + 1
            if self.pid not in self.inflight:
                return self.pid

    def handle(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind in (4, 7):  # PUBACK, PUBCOMP
            self.inflight.pop(int.from_bytes(body[:2], "big"), None)
        elif kind == 5:  # PUBREC
            pid = int.from_bytes(body[:2], "big")
            if pid in self.inflight:
                if len(body) > 2 and body[2] >= 0x80:
                    del self.inflight[pid]
                elif self.f != "no-pubrel":
                    self.inflight[pid][0] = "rel"
                    self.send(pkt(0x62, body[:2]))
                else:
                    self.inflight[pid][0] = "rel"
        elif kind == 14:
            raise Link("DISCONNECT from the server")

    def extras(self) -> None:
        """Once per run, the messages some faults add (no stored record in them)."""
        if "status" not in self.faulted and (self.retain_ok or self.f == "retain-anyway"):
            self.faulted.add("status")
            props = b""
            status = s16(self.topic.rsplit(b"/", 1)[0] + b"/status")
            self.send(pkt(0x31, status + vbi(len(props)) + props + b"online"))  # QoS 0, retained
        if self.f == "empty-batch" and "empty" not in self.faulted:
            self.faulted.add("empty")
            props = up("batch-format", "v1") + up("batch-size", "1")
            self.send(pkt(0x30, s16(self.topic) + vbi(len(props)) + props))
        if self.f == "unknown-prop" and "unk" not in self.faulted:
            self.faulted.add("unk")
            props = b"\x7f\x00" + up("batch-format", "v1") + up("batch-size", "1")
            self.send(pkt(0x30, s16(self.topic) + vbi(len(props)) + props + b"\x01x"))

    def run(self) -> int:
        self.t0 = time.monotonic()
        end = self.t0 + self.duration
        give_up = end + 15
        while True:
            now = time.monotonic()
            if now > give_up:
                break
            try:
                if self.sock is None:
                    self.connect()
                    self.extras()
                self.step(now, end)
                if now >= end and not self.waiting and not self.inflight:
                    break
                first, body = self.read(0.02)
                if first:
                    self.handle(first, body)
            except (Link, OSError):
                if self.sock is not None:
                    self.sock.close()
                self.sock = None
                time.sleep(0.1)
        ok = not self.waiting and not self.inflight
        if self.sock is not None:
            if self.f == "truncated":
                raw, _ = self.build([0], 0, 0, None)
                self.sock.sendall(raw[: len(raw) // 2])
            else:
                self.sock.sendall(b"\xe0\x01\x05" if self.f == "reason-code" else b"\xe0\x00")
                if self.f == "after-disconnect":
                    self.sock.sendall(b"\xc0\x00")
            time.sleep(0.1)
            self.sock.close()
        print(f"MQBATCH-STORED {self.stored}", flush=True)
        print(
            f"rawpub{' --fault ' + self.f if self.f else ''}: {self.batches} batches, {self.stored} records, "
            f"{len(self.inflight)} unacknowledged, {len(self.waiting)} unsent, {self.connects} connects"
        )
        return 0 if ok else 1


def main(argv: list[str]) -> int:
    fault = None
    if argv[:1] == ["--fault"]:
        fault = argv[1]
        if fault not in FAULTS:
            print(f"rawpub: unknown fault {fault!r}; one of: {', '.join(FAULTS)}", file=sys.stderr)
            return 2
    if fault == "silent":
        return 0
    return Pub(os.environ, fault).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
