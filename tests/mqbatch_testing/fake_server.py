"""A scripted fake MQTT 5 server (CPython sockets) for the device client's tests:
packets a real broker will not send (tests/firmware/test_mqtt_fake_server.py,
tests/conformance/test_conformance_qos2.py)."""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections.abc import Callable

from mqbatch.lab.devices import Fleet
from mqbatch.wire import codec, records
from mqbatch_testing.broker import Frame, run_drive

CONNACK_OK = b"\x20\x03\x00\x00\x00"
CONNACK_CODES = {
    0x00,
    0x80,
    0x81,
    0x82,
    0x83,
    0x84,
    0x85,
    0x86,
    0x87,
    0x88,
    0x89,
    0x8A,
    0x8C,
    0x90,
    0x95,
    0x97,
    0x99,
    0x9A,
    0x9B,
    0x9C,
    0x9D,
    0x9F,
}
PUBACK_CODES = {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}
PUBCOMP_CODES = {0x00, 0x92}
DISCONNECT_CODES = {
    0x00,
    0x80,
    0x81,
    0x82,
    0x83,
    0x87,
    0x89,
    0x8B,
    0x8D,
    0x8E,
    0x8F,
    0x90,
    0x93,
    0x94,
    0x95,
    0x96,
    0x97,
    0x98,
    0x99,
    0x9A,
    0x9B,
    0x9C,
    0x9D,
    0x9E,
    0x9F,
    0xA0,
    0xA1,
    0xA2,
}
TOPIC = "mqbatch/device-1/telemetry"


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def string(pid: int, text: str) -> bytes:
    t = text.encode()
    return bytes([pid]) + len(t).to_bytes(2, "big") + t


def pid_of(publish_body: bytes) -> bytes:
    """The packet identifier bytes of a QoS > 0 PUBLISH body."""
    tlen = int.from_bytes(publish_body[:2], "big")
    return publish_body[2 + tlen : 4 + tlen]


def props(*items: bytes) -> bytes:
    b = b"".join(items)
    return vbi(len(b)) + b


class Conn:
    """One client connection at the fake server: what it received, in order."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.received: list[tuple[int, bytes]] = []  # (first byte, body)
        self._buf = b""

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            try:
                data = self.sock.recv(65536)
            except (socket.timeout, OSError):
                return False
            if not data:
                return False
            self._buf += data
        return True

    def read(self) -> tuple[int, bytes] | None:
        """Next whole packet from the client, or None (closed / 3 s of silence)."""
        if not self._fill(2):
            return None
        i, n, shift = 1, 0, 0
        while True:
            if not self._fill(i + 1):
                return None
            c = self._buf[i]
            n |= (c & 0x7F) << shift
            shift += 7
            i += 1
            if not c & 0x80:
                break
        if not self._fill(i + n):
            return None
        pkt = (self._buf[0], self._buf[i : i + n])
        self._buf = self._buf[i + n :]
        self.received.append(pkt)
        return pkt

    def expect(self, ptype: int) -> bytes:
        pkt = self.read()
        assert pkt is not None and pkt[0] >> 4 == ptype, f"fake server expected packet type {ptype}, got {pkt}"
        return pkt[1]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def half_close(self) -> None:
        """Close our sending side after a packet the client may refuse at once: if the
        client has already closed the connection (it rejected the packet before we got
        here), the close this scenario wanted has happened, and ENOTCONN says just that."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            if e.errno != errno.ENOTCONN:
                raise

    def types(self) -> list[int]:
        return [f >> 4 for f, _ in self.received]


class FakeServer:
    """Serves scenario k to the k-th connection; after the scenario it reads (and
    records) whatever the client still sends until it closes."""

    def __init__(self, scenarios: list[Callable[[Conn], None]]):
        self.scenarios = scenarios
        self.conns: list[Conn] = []
        self.failures: list[str] = []
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.port = self.srv.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        for scenario in self.scenarios:
            try:
                s, _ = self.srv.accept()
            except OSError:
                return
            s.settimeout(3)
            conn = Conn(s)
            self.conns.append(conn)
            try:
                scenario(conn)
                while conn.read() is not None:
                    continue
            except (AssertionError, OSError) as e:
                self.failures.append(f"connection {len(self.conns) - 1}: {e}")
            finally:
                s.close()

    def close(self):
        self.srv.close()
        self.thread.join(5)


def drive(server: FakeServer, steps, tmp_path, client=None, subscribe=None):
    plan = {
        "transport": {"host": "127.0.0.1", "port": server.port, "plain_tcp": True, "timeout_ms": 3000},
        "client": {"client_id": "device-1", "keepalive": 30, "timeout_ms": 3000, **(client or {})},
        "subscribe": subscribe,
        "steps": steps,
    }
    try:
        events = run_drive(plan, tmp_path, timeout=180)
    finally:
        server.close()
    assert not server.failures, (server.failures, json.dumps(events))
    return events


def results(events):
    """Per step: the error or the connack/ack event that ended it, in order."""
    return [e for e in events if e["event"] in ("error", "connack", "ack")]


def record_keys(publishes: list[bytes]) -> tuple[set, list]:
    """(device, boot, seq) of every record in these raw PUBLISH packets, and the duplicates.
    A Topic Alias is resolved by the last topic named with it (one device, one topic)."""
    seen, dups, aliases = set(), [], {}
    for raw in publishes:
        f = Frame(0, "c2s", raw).publish_fields()
        alias = f["props"].get(0x23)
        topic = f["topic"] or aliases.get(alias, "")
        if f["topic"] and alias:
            aliases[alias] = f["topic"]
        if not topic.endswith("/telemetry"):
            continue
        res = codec.decode(f["props"]["user"], f["payload"], topic=topic)
        assert res.status == codec.OK, res.log
        for sub in res.messages:
            rec = records.parse(sub)
            key = (records.device_from_topic(topic), rec.boot, rec.seq)
            (dups.append(key) if key in seen else seen.add(key))
    return seen, dups


def run_device(server: FakeServer, tmp_path, config: dict, timeout: float = 60) -> tuple[int, dict, set, str]:
    """One virtual device (the firmware application, plain TCP) against the fake server
    until its run ends: (exit status, MQB-SUMMARY, records reported stored, console);
    the server is closed afterwards."""
    try:
        with Fleet(
            tmp_path / "fleet", "127.0.0.1", server.port, credentials={"dev-001": "pw"}, tls=False, config=config
        ) as fleet:
            fleet.start()
            code = fleet.wait(timeout)["dev-001"]
            return code, fleet.summaries().get("dev-001", {}), fleet.stored(), fleet.console("dev-001")
    finally:
        server.close()
