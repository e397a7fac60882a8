"""The inspecting proxy: one TCP relay on loopback between MQTT clients and a broker.

It forwards every byte unchanged, in both directions, and (for plain-TCP MQTT)
parses every packet: each is recorded (time, connection, direction, bytes) and
checked by mqbatch.conformance.session (packet, session and batch rules). It is
also the project's only network-fault injector (mqbatch.scenarios.netcut.Relay is this
class): cut the network, refuse connects, stall, delay, or cut a connection
before, in the middle of, or after a chosen packet.

    with Proxy("127.0.0.1", broker.port, batch_topics=["mqbatch/+/telemetry"]) as px:
        ...clients connect to px.port...
        px.violations            # [conformance_session.Violation]
        px.records               # [Record]: every packet, in order
        px.bytes_by_type         # {("c2s", "PUBLISH"): bytes, ...}
        px.counters()            # snapshot: bytes, TLS records/bytes, TCP segments per direction
        px.cut(); px.restore()   # drop every connection, refuse new ones / accept again
        px.refuse_connects(True) # accept and reset at once (no CONNACK) until False
        px.stall(); px.unstall() # hold every byte (the link freezes) / let them through
        px.delay(0.2)            # wait 0.2 s before forwarding each packet
        px.fault("s2c", "PUBCOMP", "drop")   # next PUBCOMP from the broker: not forwarded,
                                             # connection reset ("mid": half of it, "after": all)

TLS: a connection whose first client byte is a TLS handshake record (0x16) is
relayed and counted but not parsed (a TLS link cannot be read without terminating
it): the conformance harness uses plain-TCP listeners on loopback. What can be
counted without the keys is: its TLS records per direction (`tls_records`, from the
5-byte record headers, which are not encrypted) and their bytes (`tls_bytes`).
Every connection's TCP segments (`tcp_segments`, per direction, from the kernel's
TCP_INFO counters of the proxy's client-side socket, pure ACKs included) are added
when it closes. Loopback's MSS is about 65 KB: a real link of MSS 1448 cuts big
packets into more segments.
"""

from __future__ import annotations

import socket
import threading
import time

from mqbatch.conformance.netcount import TlsRecords, tcp_segments
from mqbatch.conformance.packets import NAMES, Malformed, packet_len, parse, read_vbi
from mqbatch.conformance.probe import MaxPacketProbe
from mqbatch.conformance.relay import _ACKS, HOLD_GRACE_S, HOLD_MAX_S, Record, _Conn, release_loop
from mqbatch.conformance.session import C2S, S2C, Checker, Violation
from mqbatch.lab.broker import free_port

__all__ = ["Proxy", "Record", "TlsRecords", "tcp_segments"]

_RST = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends RST
DRAIN_S = 2.0  # after the broker closes, how long the client's already sent bytes are still read
MAX_FRAME = 64 << 20  # the largest packet the proxy buffers to parse (beyond it: relayed unparsed)


def _clean_start(raw: bytes) -> bytes:
    """The CONNECT with its Clean Start flag set (the flags byte follows the protocol name and level)."""
    try:
        _, p = read_vbi(raw, 1)
    except Malformed:
        return raw
    i = p + 2 + int.from_bytes(raw[p : p + 2], "big") + 1
    return raw[:i] + bytes([raw[i] | 0x02]) + raw[i + 1 :] if i < len(raw) else raw


class Proxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        inspect: bool = True,
        batch_topics=("#",),
        max_batch_size: int = 100,
        max_payload_bytes: int = 65536,
        max_records: int = 200_000,
        hold_acks: bool = False,
        hold_s: float | None = None,
        max_packet_probe: bool = False,
        lose_sessions: bool = False,
    ):
        self.target = (target_host, target_port)
        self.host = host
        self.port = port or free_port(host)
        self.inspect = inspect
        self.checker = Checker(batch_topics, max_batch_size, max_payload_bytes)
        self.max_records = max_records
        self.records: list[Record] = []
        self.records_dropped = 0
        self.bytes_up = 0  # client -> target (every byte, TLS records included)
        self.bytes_down = 0  # target -> client
        self.tls_records = {C2S: 0, S2C: 0}  # TLS records relayed (TLS connections only)
        self.tls_bytes = {C2S: 0, S2C: 0}  # bytes of those connections, record headers included
        self.tcp_segments = {C2S: 0, S2C: 0}  # client <-> proxy segments of closed connections
        self.bytes_by_type: dict[tuple[str, str], int] = {}
        self.packets_by_type: dict[tuple[str, str], int] = {}
        self.connections = 0
        self.cuts = 0
        self.refused = 0  # connects refused by refuse_connects() or a broker that was down
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        # connections whose broker side the proxy closed and whose client side is still read to
        # its end: a newer connection's packets wait for them (what the client sent before it
        # left is checked before its resume)
        self._draining: dict[int, _Conn] = {}
        self._pumps: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._releaser: threading.Thread | None = None
        self._stopped = threading.Event()
        self._refuse = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._delay = 0.0
        self._faults: list[list] = []  # [direction, packet name, action]
        self.hold_acks = hold_acks
        self.probe = MaxPacketProbe() if max_packet_probe else None  # mqbatch.conformance.probe
        # every reconnect's CONNECT gets Clean Start 1 on its way to the broker: the client asked to
        # resume, the server answers Session Present 0, and the client must drop its session state
        self.lose_sessions = lose_sessions
        # with hold_s, each acknowledgement is held that long whatever the quota (a client at its
        # Receive Maximum must still send PINGREQ within its Keep Alive)
        self.hold_grace_s = hold_s if hold_s is not None else HOLD_GRACE_S
        self.hold_max_s = hold_s if hold_s is not None else HOLD_MAX_S
        self.harness_errors = 0

    @property
    def violations(self):
        with self._lock:
            return list(self.checker.violations)

    # -- life cycle (the netcut.Relay API) -------------------------------------------

    def start(self) -> "Proxy":
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.port))
        ls.listen(64)
        self._listener = ls
        self._thread = threading.Thread(target=self._accept_loop, args=(ls,), name="proxy-accept", daemon=True)
        self._thread.start()
        if self.hold_acks and self._releaser is None:
            self._releaser = threading.Thread(target=self._release_loop, name="proxy-acks", daemon=True)
            self._releaser.start()
        return self

    def cut(self) -> None:
        """Drop every connection (RST to both ends, as a dead link) and refuse new ones
        (connect: ECONNREFUSED) until restore()."""
        self.cuts += 1
        self._close_listener()
        self._drop_all()

    def restore(self) -> None:
        if self._listener is None:
            self.start()

    def stop(self) -> None:
        """Stop accepting, end the faults, read what the clients already sent (their
        connections' client sides to EOF, DRAIN_S at most in all), then reset what is left.
        A publisher that sent its last packets and exited is checked whole: resetting at
        once dropped the bytes the kernel still held unread (MQTT-AFTER-DISCONNECT came out
        NOT TESTED instead of FAIL under load)."""
        self._stopped.set()
        self._close_listener()
        if self._thread is not None:
            self._thread.join(5)
        self._flowing.set()
        self._delay = 0.0
        deadline = time.monotonic() + DRAIN_S
        with self._lock:
            conns = [*self._conns.values(), *self._draining.values()]
        for c in conns:
            c.client_done.wait(max(0.0, deadline - time.monotonic()))
        self._drop_all()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- fault injection -----------------------------------------------------------

    def refuse_connects(self, on: bool = True) -> None:
        """Accept TCP connections and reset them at once (the client gets no CONNACK)."""
        self._refuse = on

    def stall(self) -> None:
        """Forward nothing until unstall(): connections stay open, bytes wait here."""
        self._flowing.clear()

    def unstall(self) -> None:
        self._flowing.set()

    def delay(self, seconds: float) -> None:
        """Wait `seconds` before forwarding each packet (each chunk on opaque links)."""
        self._delay = max(0.0, seconds)

    def fault(self, direction: str, packet: str, action: str) -> None:
        """Once: at the next `packet` (a name, e.g. "PUBCOMP") going `direction`, "drop"
        it and reset the connection, send only its first half ("mid") then reset, or
        forward it and then reset ("after")."""
        if direction not in (C2S, S2C) or packet not in NAMES.values() or action not in ("drop", "mid", "after"):
            raise ValueError(
                f"fault({direction!r}, {packet!r}, {action!r}): direction c2s|s2c, an MQTT packet "
                f"name, action drop|mid|after"
            )
        with self._lock:
            self._faults.append([direction, packet, action])

    # -- reports ---------------------------------------------------------------------

    def counters(self) -> dict:
        """A snapshot of what has crossed so far, per direction: bytes, TLS records and bytes, and
        TCP segments (closed connections' totals plus the open ones' TCP_INFO counters now)."""
        with self._lock:
            segments = dict(self.tcp_segments)
            for c in self._conns.values():
                segs = None if c.segments_counted else tcp_segments(c.socks[0])
                if segs is not None:
                    segments[C2S] += segs[0]
                    segments[S2C] += segs[1]
            return {
                "bytes": {C2S: self.bytes_up, S2C: self.bytes_down},
                "tls_records": dict(self.tls_records),
                "tls_bytes": dict(self.tls_bytes),
                "segments": segments,
            }

    def packets(self, name: str | None = None, direction: str | None = None) -> list[Record]:
        with self._lock:
            return [
                r
                for r in self.records
                if (name is None or r.name == name) and (direction is None or r.direction == direction)
            ]

    def trace(self, conn: int | None = None, limit: int = 40, around_faults: int = 0) -> str:
        """A readable excerpt, one line per packet: the first `limit` packets, and with
        around_faults=k also k packets before and after each injected fault."""
        recs = [r for r in self.packets() if conn is None or r.conn == conn]
        if not recs:
            return "(no packets)"
        keep = set(range(min(limit, len(recs))))
        for i, r in enumerate(recs):
            if r.fault and around_faults:
                keep.update(range(max(0, i - around_faults), min(len(recs), i + around_faults + 1)))
        t0, lines, last = recs[0].t, [], -1
        for i in sorted(keep):
            if i != last + 1:
                lines.append("     ...")
            lines.append(f"{recs[i].t - t0:8.3f}s conn {recs[i].conn} {recs[i].direction} {recs[i].summary()}")
            last = i
        return "\n".join(lines)

    # -- internals -------------------------------------------------------------------

    def _close_listener(self) -> None:
        ls, self._listener = self._listener, None
        if ls is not None:
            try:
                ls.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # a listening socket may refuse shutdown; close() below ends it
            ls.close()

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
            pumps, self._pumps = self._pumps, []
        for c in conns:
            self._reset(c)
        for t in pumps:
            t.join(5)

    @staticmethod
    def _reset(c: _Conn) -> None:
        """RST both ends. shutdown() wakes the pumps blocked in recv() (close() alone does not)."""
        c.reset = True
        for s in c.socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already shut by its pump
            s.close()

    def _accept_loop(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return  # listener closed by cut()/stop()
            if self._refuse:
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                self.refused += 1
                client.close()  # the broker is down: the client sees the connection close
                continue
            upstream.settimeout(None)
            with self._lock:
                n = self.connections
                self.connections += 1
                c = _Conn(n, client, upstream, self.checker.connection(n) if self.inspect else None)
                self._conns[n] = c
                pumps = [
                    threading.Thread(target=self._pump, args=(c, d), daemon=True, name=f"proxy-{n}-{d}")
                    for d in (C2S, S2C)
                ]
                self._pumps = [t for t in self._pumps if t.is_alive()] + pumps
            for t in pumps:
                t.start()

    def _pump(self, c: _Conn, direction: str) -> None:
        src, dst = c.socks if direction == C2S else c.socks[::-1]
        buf = b""
        if direction == C2S:
            self._after_drained(c)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    if direction == C2S and not c.reset:
                        c.client_eof = True
                    self._truncated(c, direction, buf)
                    break
                with self._lock:
                    if direction == C2S:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
                if direction == C2S and c.check is not None and c.check.index == 0 and not buf and data[0] == 0x16:
                    c.tls = True  # a TLS ClientHello: relay and count only
                if c.tls:
                    with self._lock:
                        framing = c.tls_framing[direction]
                        before = framing.records
                        framing.feed(data)
                        self.tls_records[direction] += framing.records - before
                        self.tls_bytes[direction] += len(data)
                if c.foreign and not c.tls:
                    buf = self._record_only(c, direction, buf + data)
                    self._send(c, direction, dst, data)
                    continue
                if c.check is None or c.tls:
                    self._send(c, direction, dst, data)
                    continue
                buf += data
                while buf:
                    why = self._unframed(c, direction, buf)
                    if why is not None:  # not MQTT any more: record it, relay the rest as is
                        rule, text = why
                        self._note(c, direction, rule, buf, text)
                        self._send(c, direction, dst, buf)
                        buf = b""
                        c.check = None
                        break
                    n = packet_len(buf)
                    if n is None or len(buf) < n:
                        break
                    raw, buf = buf[:n], buf[n:]
                    if not self._packet(c, direction, raw, dst):
                        return
                    if c.check is not None and c.check.foreign:  # not MQTT 5: named once, then relayed
                        with self._lock:  # no checker end for it; still a connection whose TCP segments count
                            c.check = None
                            c.foreign = True
                        self._send(c, direction, dst, buf)
                        buf = self._record_only(c, direction, buf)
                        break
        except OSError:  # either side went away (or cut() reset it): end this direction
            self._truncated(c, direction, buf)
        finally:
            self._pump_end(c, direction, src, dst)

    def _after_drained(self, c: _Conn) -> None:
        """Before a connection's first packet: wait until the older connections the proxy is
        draining have been read to their end (DRAIN_S at most: _pump_end closes them then), so a
        client's resume is checked after what it sent on the connection it left."""
        deadline = time.monotonic() + DRAIN_S
        with self._lock:
            older = [d for n, d in self._draining.items() if n < c.number]
        for d in older:
            d.client_done.wait(max(0.0, deadline - time.monotonic()))

    def _record_only(self, c: _Conn, direction: str, buf: bytes) -> bytes:
        """Frame and record the whole packets of a connection that is not MQTT 5 (its bytes are
        relayed by the caller, unchecked): the benchmarks read an MQTT 3.1.1 client's packets.
        Returns what is left of an unfinished packet; a stream that cannot be framed is dropped."""
        while buf:
            try:
                n = packet_len(buf)
            except Malformed:
                return b""
            if n is None or len(buf) < n or n > MAX_FRAME:
                return b"" if n is not None and n > MAX_FRAME else buf
            raw, buf = buf[:n], buf[n:]
            with self._lock:
                if len(self.records) < self.max_records:
                    self.records.append(Record(time.monotonic(), c.number, direction, raw))
                else:
                    self.records_dropped += 1
        return buf

    def _truncated(self, c: _Conn, direction: str, buf: bytes) -> None:
        """A stream its sender ended (closed or reset, not the proxy) inside a packet."""
        if buf and c.check is not None and not c.tls and not c.reset:
            self._note(
                c,
                direction,
                "MQTT-MALFORMED",
                buf,
                f"the stream ended inside a packet ({len(buf)} bytes of it arrived)",
            )

    def _unframed(self, c: _Conn, direction: str, buf: bytes) -> tuple[str, str] | None:
        """Why the stream cannot be framed from here (rule, text), or None."""
        try:
            n = packet_len(buf)
        except Malformed as e:
            return e.rule, f"stream no longer framed: {e.text}"
        if n is None:
            return None
        limit = c.check.side[direction].max_packet if c.check is not None else MAX_FRAME
        if n > MAX_FRAME and n > limit:  # too large to buffer: named from its header alone
            return "MQTT-MAX-PACKET-SIZE", (
                f"a packet header declaring {n} bytes > the receiver's Maximum Packet Size {limit} "
                "[MQTT-3.2.2-15]; the rest of the stream is relayed unparsed"
            )
        if n > MAX_FRAME:
            return "HARNESS-LIMIT", f"a packet of {n} bytes: above the {MAX_FRAME} bytes the proxy buffers"
        return None

    def _pump_end(self, c: _Conn, direction: str, src, dst) -> None:
        if direction == C2S:
            c.client_done.set()
            with self._lock:
                self._draining.pop(c.number, None)
        else:
            # the broker closed: the client sees it (half-close), and what the client had already
            # sent (a DISCONNECT, a packet after it) is still read and checked for a moment
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the client is gone already
            c.client_done.wait(DRAIN_S)
        with self._lock:  # the first pump to end counts, before either closes the sockets
            if not c.segments_counted:
                c.segments_counted = True
                segs = tcp_segments(c.socks[0])
                if segs is not None:
                    self.tcp_segments[C2S] += segs[0]
                    self.tcp_segments[S2C] += segs[1]
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
            s.close()
        with self._lock:
            if self._conns.pop(c.number, None) is not None and c.check is not None:
                self._close_check(c)

    def _close_check(self, c: _Conn) -> None:
        """The session checker's end of connection (under self._lock); never raises."""
        try:
            c.check.close(time.monotonic(), by_client=c.client_eof)
        except Exception as e:  # noqa: BLE001 - a checker bug must not end the relay; it is reported
            self._harness_error(c, "close", e)

    def _harness_error(self, c: _Conn, where: str, e: Exception) -> None:
        self.harness_errors += 1
        self.checker.violations.append(
            Violation("HARNESS-ERROR", c.number, C2S, -1, where, f"the checker failed: {type(e).__name__}: {e}")
        )

    def _send(self, c: _Conn, direction: str, dst: socket.socket, data: bytes) -> None:
        """_forward; once the broker's side fails, the client's further bytes are only read
        and checked (the broker closing the connection must not hide what the client sent)."""
        if direction == C2S and c.broker_gone:
            return
        try:
            if direction == S2C:
                with c.send_lock:
                    self._forward(dst, data)
            else:
                self._forward(dst, data)
        except OSError:
            if direction != C2S:
                raise
            c.broker_gone = True

    def _forward(self, dst: socket.socket, data: bytes) -> None:
        self._flowing.wait()
        if self._delay:
            time.sleep(self._delay)
        dst.sendall(data)

    def _packet(self, c: _Conn, direction: str, raw: bytes, dst: socket.socket) -> bool:
        """Record, check and forward one whole packet; False if a fault ended the connection."""
        now = time.monotonic()
        with self._lock:
            probe_cut = False
            if self.probe is not None:
                raw, probe_cut = self.probe.packet(c.number, direction, raw)
            if self.lose_sessions and c.number > 0 and direction == C2S and raw[:1] == b"\x10":
                raw = _clean_start(raw)
            rec = Record(now, c.number, direction, raw)
            if len(self.records) < self.max_records:
                self.records.append(rec)
            else:
                self.records_dropped += 1
            key = (direction, rec.name)
            self.bytes_by_type[key] = self.bytes_by_type.get(key, 0) + len(raw)
            self.packets_by_type[key] = self.packets_by_type.get(key, 0) + 1
            action = None
            for f in self._faults:
                if f[0] == direction and f[1] == rec.name:
                    action = f[2]
                    self._faults.remove(f)
                    break
            rec.fault = action
            # a dropped or torn acknowledgement never reached the sender of the message: its state
            # stays open (a resend with DUP is then right); any other packet was sent, so the
            # sender's state counts it even if the peer never got it whole
            hold = self.hold_acks and action is None and direction == S2C and rec.name in _ACKS
            if hold:  # recorded and checked when released (what the client sees, when it sees it)
                if self.records and self.records[-1] is rec:
                    self.records.pop()
                if not c.held:
                    c.held_since = now
                c.held.append(raw)
            elif action in (None, "after") or rec.name not in _ACKS:
                self._feed(c, direction, raw, now)
            if probe_cut and action is None and not hold and c.check is not None and not c.check.side[C2S].inflight:
                # nothing left open: close after this acknowledgement (FIN, not RST: the client reads it
                # first); the next CONNACK tells the next limit
                action = rec.fault = "close"
        if hold:
            return True
        if action is None:
            self._send(c, direction, dst, raw)
            return True
        if action == "mid":
            self._forward(dst, raw[: max(1, len(raw) // 2)])
        elif action in ("after", "close"):
            self._forward(dst, raw)
        self.cuts += 1
        with self._lock:
            if self._conns.pop(c.number, None) is not None and c.check is not None:
                self._close_check(c)
            if action == "close" and direction == S2C:
                self._draining[c.number] = c
        if action == "close":  # an orderly close: what was forwarded is read before the end of stream
            c.reset = True
            socks = c.socks
            if direction == S2C:
                # the broker's side closes now; the client's is half-closed by _pump_end (FIN after
                # the acknowledgement) and read to its end, unforwarded: a PUBLISH it sent before it
                # read the close is open for it, and its DUP resend after the resume is no stray DUP
                c.broker_gone = True
                socks = c.socks[1:]
            for sock in socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by its peer
                sock.close()
        else:
            self._reset(c)
        return False

    def _feed(self, c: _Conn, direction: str, raw: bytes, now: float) -> None:
        """The session checker on one packet (under self._lock); a checker bug is reported, the
        relay goes on."""
        try:
            c.check.feed(direction, raw, now)
        except Exception as e:  # noqa: BLE001 - see _harness_error
            self._harness_error(c, parse(raw).summary(), e)

    def _release_loop(self) -> None:
        release_loop(self)

    def _note(self, c: _Conn, direction: str, rule: str, buf: bytes, why: str) -> None:
        with self._lock:
            self.checker.violations.append(
                Violation(rule, c.number, direction, c.check.index if c.check else -1, buf[:8].hex(), why)
            )
