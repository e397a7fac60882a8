"""The device application (firmware/mqb_app.py, a virtual device in the Unix port) resuming
a session whose in-flight table has a hole: a slot freed by an acknowledgement (or by a
batch re-stored in smaller parts) below a slot whose PUBLISH is still open.

Found by `mqbatch conformance publisher --scenario max-packet-probe` (3 of 6 runs): the
proxy cuts the connection just after a PUBACK, the batches the device had sent after it
stay open, and on the next connection (Session Present 1) the device rebooted with
RuntimeError 'in-flight table full: client allowed more than receive_max'. The cause: a
resend (DUP=1, same packet id) took the first free slot of the application's table
instead of the one its message already had, so the message sat in two slots; the ack
freed one, the other stayed forever, and the window the client allowed no longer fit.

A scripted broker (tests/mqbatch_testing/fake_server.py) makes the hole without timing
luck: it withholds acknowledgements until the device's Receive Maximum (4) is used up,
refuses the oldest batch with PUBACK 0x97 Quota exceeded (the device keeps it and holds
back new sends for backoff.initial_ms, so nothing fills the freed slot) and closes. On
the resumed session it again withholds acknowledgements until 4 PUBLISHes are open.

Second finding of the same scenario (1 run in 12 once the first was fixed): an open
message whose PUBLISH fits the new Maximum Packet Size exactly was split, because the
split decision used the batch budget (which counts flush.max_count's batch-size digits
and a Topic Alias), so it was never resent with its packet id [MQTT-4.4.0-1]."""

from __future__ import annotations

import socket

import pytest

from mqbatch_testing.broker import Frame
from mqbatch_testing.fake_server import CONNACK_OK, Conn, FakeServer, packet, props, record_keys, run_device, string

WINDOW = 4  # the device's receive_max (mqb_config default)
CONNACK_RESUMED = b"\x20\x03\x01\x00\x00"  # Session Present 1, success, no properties
# backoff.initial_ms 300: the hold after a PUBACK 0x97 outlasts the scripted broker's close
CONFIG = {
    "sample_hz": 20,
    "run_for_s": 3,
    "drain_timeout_s": 15,
    "health_every_s": 1,
    "require_subscribers": False,
    "backoff": {"initial_ms": 300, "max_ms": 1000},
}


def _pid(raw: bytes) -> int:
    return Frame(0, "c2s", raw).publish_fields()["pid"]


def _dup(raw: bytes) -> bool:
    return bool(raw[0] & 0x08)


class Broker:
    """Connection 0: four PUBLISHes, the oldest refused 0x97, closed. Connection 1 on
    (Session Present 1): acknowledgements withheld until WINDOW are open (or 0.5 s
    pass with fewer), then all given; the peak of open PUBLISHes per connection noted."""

    def __init__(self):
        self.got: list[bytes] = []  # every PUBLISH received (resends included)
        self.conns: list[list[bytes]] = []
        self.peak: list[int] = []

    def _accept(self, c: Conn, connack: bytes) -> list[bytes]:
        c.expect(1)
        c.send(connack)
        self.conns.append([])
        self.peak.append(0)
        return self.conns[-1]

    def first(self, c: Conn):
        mine = self._accept(c, CONNACK_OK)
        while len(mine) < WINDOW:
            pkt = c.read()
            assert pkt is not None, f"the device sent {len(mine)} PUBLISHes, not {WINDOW}, before going quiet"
            first_byte, body = pkt
            if first_byte >> 4 == 3:
                raw = packet(first_byte, body)
                mine.append(raw)
                self.got.append(raw)
            elif first_byte >> 4 == 12:
                c.send(b"\xd0\x00")
        self.peak[-1] = len(mine)
        refused = _pid(mine[0]).to_bytes(2, "big")
        c.send(packet(0x40, refused + b"\x97" + props(string(0x1F, "quota exceeded"))))
        c.sock.shutdown(socket.SHUT_RDWR)

    def resumed(self, c: Conn):
        mine = self._accept(c, CONNACK_RESUMED)
        c.sock.settimeout(0.5)
        open_pids: list[int] = []
        quiet = 0
        while True:
            pkt = c.read()
            if pkt is None:
                if _closed(c.sock):
                    return
                quiet += 1
                if quiet > 60:  # 30 s without a packet
                    return
            else:
                quiet = 0
                first_byte, body = pkt
                kind = first_byte >> 4
                if kind == 14:
                    return
                if kind == 12:
                    c.send(b"\xd0\x00")
                if kind == 3:
                    raw = packet(first_byte, body)
                    mine.append(raw)
                    self.got.append(raw)
                    open_pids.append(_pid(raw))
                    self.peak[-1] = max(self.peak[-1], len(open_pids))
            if open_pids and (pkt is None or len(open_pids) >= WINDOW):
                for pid in open_pids:
                    c.send(packet(0x40, pid.to_bytes(2, "big")))
                open_pids.clear()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, TimeoutError):  # nothing to read yet (a timeout socket waits first)
        return False
    except OSError:
        return True


def test_resend_after_resume_keeps_its_own_slot_and_the_window_fits(tmp_path):
    b = Broker()
    server = FakeServer([b.first] + [b.resumed] * 4)
    code, s, stored, console = run_device(
        server, tmp_path, {**CONFIG, "flush": {"max_count": 5, "max_bytes": 2048, "max_age_ms": 1000}}
    )
    assert not server.failures, (server.failures, console[-3000:])
    assert "in-flight table full" not in console, console[-3000:]
    assert code == 0, console[-3000:]
    # the scenario happened: 4 open, the oldest refused, the other 3 resent first with DUP=1 and
    # their own packet ids, in order, and the resumed connection used the whole window
    first, second = b.conns[0], b.conns[1]
    assert [_pid(r) for r in second[:3]] == [_pid(r) for r in first[1:]], console[-3000:]
    assert all(_dup(r) for r in second[:3]) and not any(_dup(r) for r in second[3:])
    assert b.peak[1] == WINDOW, (b.peak, console[-3000:])
    assert s["reconnects"] >= 1 and s["refused_batches"] == 1, s
    assert (s["dropped_total"], s["outbox_depth"]) == (0, 0), s
    assert s["acked_records"] == s["stored_records"], s
    delivered, _ = record_keys(b.got)
    assert stored and stored <= delivered


# -- an open message that fits the new Maximum Packet Size exactly is resent, not split --------

TOPIC_LEN = len("mqbatch/dev-001/telemetry")


def _connack(session_present: int, max_packet: int | None = None, alias_max: int = 0) -> bytes:
    p = (b"\x27" + max_packet.to_bytes(4, "big") if max_packet else b"") + (
        b"\x22" + alias_max.to_bytes(2, "big") if alias_max else b""
    )
    return packet(0x20, bytes([session_present, 0]) + props(p))


class ExactBroker(Broker):
    """Connection 0 (Topic Alias Maximum `alias_max`): two PUBLISHes, none acknowledged
    (alias: the first refused 0x97, so the second, alias-only, is resent first), closed.
    Connection 1 on: Session Present 1 and a Maximum Packet Size that the resend of the
    open messages meets exactly: their own size, or without aliases the alias-only one plus
    the topic name it now needs, less the 3 bytes of the alias it need not define."""

    def __init__(self, alias_max: int):
        super().__init__()
        self.alias_max = alias_max
        self.limit = 0

    def first(self, c: Conn):
        mine = self._accept(c, _connack(0, alias_max=self.alias_max))
        while len(mine) < 2:
            pkt = c.read()
            assert pkt is not None, "the device went quiet before 2 PUBLISHes"
            if pkt[0] >> 4 == 3:
                mine.append(packet(*pkt))
                self.got.append(mine[-1])
        if self.alias_max:
            c.send(packet(0x40, _pid(mine[0]).to_bytes(2, "big") + b"\x97"))
            self.limit = len(mine[1]) + TOPIC_LEN - 3
        else:
            self.limit = max(len(r) for r in mine)
        c.sock.shutdown(socket.SHUT_RDWR)

    def _accept(self, c: Conn, connack: bytes) -> list[bytes]:
        if connack == CONNACK_RESUMED:  # resumed() asks for it: the exact limit instead
            connack = _connack(1, self.limit, self.alias_max)
        return super()._accept(c, connack)


@pytest.mark.parametrize("alias_max", [0, 1], ids=["digits", "alias"])
def test_open_message_fitting_the_new_limit_exactly_is_resent_with_its_packet_id(tmp_path, alias_max):
    """The device's batch budget counts the batch-size digits of flush.max_count (3 for
    100) and a Topic Alias; an open message of a resumed session was split whenever its
    payload passed that budget, even when its PUBLISH fitted: it was then never resent
    with its packet id [MQTT-4.4.0-1] (conformance max-packet-probe, 1 run in 12: an
    alias-only message that fitted with the topic name and no alias)."""
    b = ExactBroker(alias_max)
    server = FakeServer([b.first] + [b.resumed] * 4)
    flush = {"max_count": 100, "max_bytes": 2048, "max_age_ms": 300}  # < 10 records a batch: 1 digit, not 3
    code, s, stored, console = run_device(server, tmp_path, {**CONFIG, "flush": flush})
    assert not server.failures, (server.failures, console[-3000:])
    assert code == 0, console[-3000:]
    first, second = b.conns[0], b.conns[1]
    resent = first[1:] if alias_max else first
    assert [(_pid(r), _dup(r)) for r in second[: len(resent)]] == [(_pid(r), True) for r in resent], console[-3000:]
    assert max(len(r) for r in second[: len(resent)]) == b.limit  # on the limit, not over it
    assert max(len(r) for r in b.got[len(first) :]) <= b.limit
    assert (s["dropped_total"], s["outbox_depth"]) == (0, 0) and s["acked_records"] == s["stored_records"], s
    delivered, _ = record_keys(b.got)
    assert stored and stored <= delivered
