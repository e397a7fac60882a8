"""The device application (firmware/mqb_app.py, in the Unix port) against a real Mosquitto
whose limits are below what the app asks for: Maximum QoS 0 or 1, Retain Available 0.
Found by `mqbatch conformance` (max-qos-0, max-qos-1, retain-unavailable): the app
used to retry the same refused CONNECT (or its own refused PUBLISH) forever.
A WireTap between device and broker records every packet as it was on the wire."""

from __future__ import annotations

from test_app import delivered, fleet_config

from mqbatch.lab.devices import Fleet

CONNECT, CONNACK, PUBLISH, PINGREQ = 1, 2, 3, 12


def will_flags(frame) -> tuple[int, bool]:
    """(Will QoS, Will Retain) of a CONNECT: its flags byte follows "MQTT" and the version."""
    flags = frame.raw[frame.body_start() + 7]
    assert flags & 0x04, "CONNECT without a Will"
    return (flags >> 3) & 3, bool(flags & 0x20)


def connack_codes(tap) -> list[int]:
    return [f.raw[f.body_start() + 1] for f in tap.packets(CONNACK, "s2c")]


def run_device(tap, tmp_path, **cfg):
    with Fleet(
        tmp_path / "fleet",
        tap.host,
        tap.port,
        credentials={"dev-001": "pw"},
        tls=False,
        config=fleet_config(**{"run_for_s": 3, "drain_timeout_s": 20, **cfg}),
    ) as fleet:
        fleet.start()
        codes = fleet.wait(60)
        return codes["dev-001"], fleet.summaries().get("dev-001", {}), fleet.stored(), fleet.console("dev-001")


def test_max_qos_0_will_lowered_and_batches_sent_at_qos0_kept_until_the_broker_read_them(
    mosquitto, subscriber, wiretap, tmp_path
):
    broker = mosquitto(max_qos=0)
    sub = subscriber(broker, "mqbatch/#", qos=0)
    tap = wiretap(broker)
    code, s, stored, console = run_device(tap, tmp_path)
    connects = tap.packets(CONNECT, "c2s")
    # one refusal (0x9B: the Will's QoS 1), then a CONNECT with a QoS 0 Will is accepted
    assert connack_codes(tap)[:2] == [0x9B, 0x00] and len(connects) == 2, (connack_codes(tap), console[-2000:])
    assert [will_flags(f)[0] for f in connects] == [1, 0]
    assert "Will" in console and "QoS 0" in console, console[-2000:]
    assert code == 0 and s["drained"], console[-3000:]
    assert {f.publish_fields()["qos"] for f in tap.packets(PUBLISH, "c2s")} == {0}
    # QoS 0 has no acknowledgement: counted apart from acked, confirmed by a PINGRESP after the batch
    assert s["publish_qos"] == 0 and s["will_qos"] == 0
    assert s["acked_records"] == 0 and s["qos0_records"] == s["stored_records"] > 0 and s["dropped_total"] == 0
    assert len(tap.packets(PINGREQ, "c2s")) >= 1
    got, _, _ = delivered(sub.settle(quiet=1.0))
    assert stored and stored == got


def test_min_qos_1_refuses_to_publish_at_qos0_and_keeps_the_outbox(mosquitto, wiretap, tmp_path):
    """The choice for users who want an acknowledgement for every batch: min_qos 1."""
    broker = mosquitto(max_qos=0)
    tap = wiretap(broker)
    code, s, stored, console = run_device(tap, tmp_path, min_qos=1, drain_timeout_s=2)
    assert tap.packets(PUBLISH, "c2s") == []
    assert code == 1 and not s["drained"] and s["outbox_records"] == s["stored_records"] > 0, console[-2000:]
    assert "min_qos 1" in console and s["last_error"] == 0x9B
    # not a reconnect loop: one try per backoff.max_ms (2 s here, jittered down to 1 s) in ~5 s
    assert len(tap.packets(CONNECT, "c2s")) <= 7, console[-2000:]


def test_retain_unavailable_will_sent_unretained(mosquitto, subscriber, wiretap, tmp_path):
    broker = mosquitto(retain_available=False)
    sub = subscriber(broker, "mqbatch/#")
    tap = wiretap(broker)
    code, s, stored, console = run_device(tap, tmp_path)
    connects = tap.packets(CONNECT, "c2s")
    assert connack_codes(tap)[:2] == [0x9A, 0x00] and len(connects) == 2, (connack_codes(tap), console[-2000:])
    assert [will_flags(f) for f in connects] == [(1, True), (1, False)]
    assert "retain" in console.lower() and s["will_retain"] is False
    assert code == 0 and s["drained"] and s["acked_records"] == s["stored_records"] > 0, console[-3000:]
    assert not any(f.flags & 1 for f in tap.packets(PUBLISH, "c2s"))
    got, _, _ = delivered(sub.settle(quiet=1.0))
    assert stored and stored == got


def test_max_qos_1_app_qos_2_publishes_at_qos_1(mosquitto, subscriber, wiretap, tmp_path):
    broker = mosquitto(max_qos=1)
    sub = subscriber(broker, "mqbatch/#")
    tap = wiretap(broker)
    code, s, stored, console = run_device(tap, tmp_path, qos=2)
    assert len(tap.packets(CONNECT, "c2s")) == 1, console[-2000:]
    assert code == 0 and s["drained"] and s["acked_records"] == s["stored_records"] > 0, console[-3000:]
    assert {f.publish_fields()["qos"] for f in tap.packets(PUBLISH, "c2s")} == {1}
    assert s["publish_qos"] == 1 and console.count("Maximum QoS 1") == 1, console[-2000:]
    got, _, _ = delivered(sub.settle(quiet=1.0))
    assert stored and stored == got
