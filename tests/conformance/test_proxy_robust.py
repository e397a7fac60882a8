"""The inspecting proxy cannot be knocked over: whatever either side sends is relayed unchanged
and parsed to its end or named; a checker that fails is reported (row HARNESS), never the end
of the forwarding thread. The parser and checker are fuzzed (the long run is
`python -m mqbatch.conformance.fuzz 1000000 7`, docs/conformance.md)."""

from __future__ import annotations

import socket
import threading
import time

from mqbatch.conformance import fuzz
from mqbatch.conformance import session as S
from mqbatch.conformance.proxy import Proxy

H = bytes.fromhex
CONNECT_311 = H("10 10 0004 4d515454 04 02 003c 0004 756d7174")  # umqtt.simple: MQTT 3.1.1, client "umqt"
CONNECT_5 = H("10 12 0004 4d515454 05 02 003c 03 21 0014 0002 6331")
CONNACK_5 = H("20 08 00 00 05 27 00000064")  # Maximum Packet Size 100
PUB_UNKNOWN_PROP = H("30 0a 0003 742f78 02 7f 00 01 41")  # property identifier 0x7f


class Sink:
    """A TCP server standing in for the broker: records what arrives, can answer."""

    def __init__(self, answer: bytes = b""):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(4)
        self.port = self.ls.getsockname()[1]
        self.got = bytearray()
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.answer:
                c.sendall(self.answer)
            while data := c.recv(65536):
                self.got += data
            c.close()


def _send(port: int, *chunks: bytes, wait: float = 0.3) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", port))
    for ch in chunks:
        c.sendall(ch)
        time.sleep(0.02)
    time.sleep(wait)
    return c


def _until(cond, timeout=3.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.02)
    return cond()


def test_mqtt_311_connect_is_named_and_relayed():
    sink = Sink()
    with Proxy("127.0.0.1", sink.port) as px:
        rest = H("30 07 0003 742f78 4142")  # a 3.1.1 PUBLISH (no properties)
        c = _send(px.port, CONNECT_311, rest)
        c.close()
        assert _until(lambda: bytes(sink.got) == CONNECT_311 + rest)
        rules = [v.rule for v in px.violations]
    assert rules == ["MQTT-VERSION"], rules  # named once; the 3.1.1 PUBLISH is not misread as MQTT 5
    assert "MQTT 3.1.1" in px.violations[0].text and "not MQTT 5" in px.violations[0].text


def test_unknown_property_truncation_and_oversize_are_named_and_the_relay_goes_on():
    sink = Sink(answer=CONNACK_5)
    with Proxy("127.0.0.1", sink.port, batch_topics=["batches/#"]) as px:
        # unknown property (main: KeyError 'alias' killed the forwarding thread), then a good packet
        c = _send(px.port, CONNECT_5, PUB_UNKNOWN_PROP, H("c0 00"))
        c.close()
        assert _until(lambda: bytes(sink.got).endswith(H("c0 00")))
        # 200 bytes > the server's Maximum Packet Size 100; then a header declaring 100 MB: named from the
        # header alone (the proxy buffers at most 64 MiB), the rest relayed unparsed
        n = len(sink.got)
        big = H("30 c8 01 0003 742f78 00") + b"x" * 194
        huge = H("30 80 80 80 30") + b"y" * 50
        c = _send(px.port, CONNECT_5, wait=0)
        assert c.recv(100) == CONNACK_5  # the limit is known before the packets come
        c.sendall(big + huge)
        time.sleep(0.3)
        c.close()
        assert _until(lambda: len(sink.got) == n + len(CONNECT_5) + len(big) + len(huge))
        # a stream that ends inside a packet
        c = _send(px.port, CONNECT_5, H("30 20 0003"))
        c.close()
        assert _until(lambda: any("ended inside a packet" in v.text for v in px.violations))
        rules = sorted({v.rule for v in px.violations})
    assert rules == ["MQTT-MALFORMED", "MQTT-MAX-PACKET-SIZE", "MQTT-PROP-ALLOWED"], px.violations
    sizes = [v.text for v in px.violations if v.rule == "MQTT-MAX-PACKET-SIZE"]
    assert len(sizes) == 2 and "203 bytes" in sizes[0] and "100663301 bytes" in sizes[1], sizes


def test_a_checker_that_fails_is_reported_and_the_relay_goes_on(monkeypatch):
    def broken(self, direction, raw, t=0.0):
        raise KeyError("alias")

    monkeypatch.setattr(S.Connection, "feed", broken)
    sink = Sink()
    with Proxy("127.0.0.1", sink.port) as px:
        c = _send(px.port, CONNECT_5, H("c0 00"))
        c.close()
        assert _until(lambda: bytes(sink.got) == CONNECT_5 + H("c0 00"))
        errors = [v for v in px.violations if v.rule == "HARNESS-ERROR"]
    assert len(errors) == 2 and "KeyError" in errors[0].text


def test_fuzz_short_run_has_no_crash_and_can_find_one(monkeypatch, capsys):
    r = fuzz.fuzz(10_000, 3)
    assert (r["n"], r["crashes"]) == (10_000, 0), r["first_crash"]
    assert r["packets"] > 10_000 and r["unframed"] > 100  # good and broken streams both exercised
    with capsys.disabled():
        print(f"\nFUZZ n={r['n']} crashes=0 packets={r['packets']} unframed={r['unframed']} {r['seconds']} s")
    # the instrument can fail: a checker that raises on a PUBREC is found
    real = S.Connection.feed

    def fragile(self, direction, raw, t=0.0):
        if raw[:1] == b"\x50":
            raise IndexError("boom")
        return real(self, direction, raw, t)

    monkeypatch.setattr(S.Connection, "feed", fragile)
    assert fuzz.fuzz(2_000, 3)["crashes"] > 0
