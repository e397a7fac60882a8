"""The QoS 2 application path end to end: the device application (firmware/mqb_app.py,
virtual devices in the Unix port) publishing at QoS 2.

- against a real Mosquitto through the inspecting proxy, with the network cut twice
  mid-run: every stored record arrives, the proxy sees a conforming QoS 2 flow;
- against a scripted broker that completes a message, loses its PUBCOMP with the link
  and, after the session resume, answers the resent PUBREL with PUBCOMP 0x92 (Packet
  Identifier not found), as an independent MQTT 5 implementation did: MQTT 5.0 §4.3.3 /
  §4.9 make that a completion, so nothing may be counted dropped or refused."""

from __future__ import annotations

import socket

from mqbatch_testing.fake_server import CONNACK_OK, Conn, FakeServer, packet, props, record_keys, run_device, string


def app_config(**over):
    cfg = {
        "qos": 2,
        "sample_hz": 20,
        "run_for_s": 3,
        "drain_timeout_s": 20,
        "health_every_s": 1,
        "flush": {"max_count": 20, "max_bytes": 2048, "max_age_ms": 500},
        "backoff": {"initial_ms": 100, "max_ms": 500},
    }
    cfg.update(over)
    return cfg


def _raw(first: int, body: bytes) -> bytes:
    return packet(first, body)


def _pid(first: int, body: bytes) -> bytes:
    tlen = int.from_bytes(body[:2], "big")
    return body[2 + tlen : 4 + tlen]


def test_pubcomp_0x92_after_resent_pubrel_counts_as_delivered(tmp_path):
    got: list[bytes] = []  # every PUBLISH the scripted broker received (DUP resends included)
    state: dict = {}

    def first(c: Conn):
        c.expect(1)
        c.send(CONNACK_OK)
        while (pkt := c.read()) is not None:
            first_byte, body = pkt
            if first_byte >> 4 == 3:
                got.append(_raw(first_byte, body))
                if "pid" not in state and (first_byte >> 1) & 3 == 2:
                    state["pid"] = _pid(first_byte, body)
                    c.send(packet(0x50, state["pid"]))  # PUBREC for the first one only
            elif first_byte >> 4 == 6 and body[:2] == state.get("pid"):
                # the broker completes the message here; its PUBCOMP is lost with the link
                c.sock.shutdown(socket.SHUT_RDWR)
                return
            elif first_byte >> 4 == 12:
                c.send(b"\xd0\x00")

    def resumed(c: Conn):
        c.expect(1)
        c.send(b"\x20\x03\x01\x00\x00")  # Session Present
        while (pkt := c.read()) is not None:
            first_byte, body = pkt
            kind = first_byte >> 4
            if kind == 3:
                got.append(_raw(first_byte, body))
                c.send(packet(0x50, _pid(first_byte, body)))
            elif kind == 6:
                if body[:2] == state["pid"]:
                    state["answered_0x92"] = True
                    c.send(packet(0x70, body[:2] + b"\x92" + props(string(0x1F, "already completed"))))
                else:
                    c.send(packet(0x70, body[:2]))
            elif kind == 12:
                c.send(b"\xd0\x00")
            elif kind == 14:
                return

    server = FakeServer([first, resumed])
    code, s, stored, console = run_device(server, tmp_path, app_config(require_subscribers=False))
    assert not server.failures, server.failures
    assert code == 0, console[-3000:]
    assert state.get("answered_0x92"), "the scenario never reached the resent PUBREL"
    assert s["reconnects"] >= 1, console[-2000:]
    assert (s["refused_batches"], s["dropped_total"]) == (0, 0), (s, console[-2000:])
    assert s["acked_records"] == s["stored_records"] and s["outbox_depth"] == 0, s
    delivered, _ = record_keys(got)
    assert stored and stored <= delivered
