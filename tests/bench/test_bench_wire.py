"""`mqbatch bench wire` (issue 15): bytes per record on the wire vs batch size, split into
record bytes, framing, MQTT, TLS and TCP/IP, against umqtt.simple and a JSON array, plus
records/s and heap bytes per record. The --quick run is the real thing at smoke-test
size (MicroPython Unix port, Mosquitto over TLS, the project's proxy). No timing is
asserted: only the byte accounting, which does not depend on the machine's load."""

from __future__ import annotations

import json
import re

import pytest


def test_physical_limit_is_records_plus_the_fewest_segments():
    from mqbatch.bench.wire import limit

    assert limit(1, 1448) == 38 + 52
    assert limit(100, 1448) == pytest.approx(38 + 52 * 3 / 100)  # 3,800 B: 3 segments of 1,448
    assert limit(38, 1448) == pytest.approx(38 + 52 * 1 / 38)  # 1,444 B: one segment
    assert limit(39, 1448) == pytest.approx(38 + 52 * 2 / 39)  # 1,482 B: two
    assert limit(500, 65483) == pytest.approx(38 + 52 / 500)


def test_publish_split_into_header_and_payload_for_mqtt5_and_311():
    from mqbatch.bench.wire import split_publish

    body5 = b"\x00\x03a/b" + b"\x00\x07" + b"\x03" + b"\x23\x00\x01" + b"xyz"  # topic, pid, props (alias 1)
    raw5 = bytes([0x32, len(body5)]) + body5
    assert split_publish(raw5, v5=True) == (13, b"xyz")
    body3 = b"\x00\x03a/b" + b"\x00\x07" + b"xyz"  # MQTT 3.1.1: no properties
    assert split_publish(bytes([0x32, len(body3)]) + body3, v5=False) == (9, b"xyz")
    qos0 = b"\x00\x01t" + b"\x00" + b"p" * 200  # QoS 0: no packet id; RL 2 bytes
    raw0 = bytes([0x30, len(qos0) & 0x7F | 0x80, len(qos0) >> 7]) + qos0
    assert split_publish(raw0, v5=True) == (7, b"p" * 200)


def test_json_array_holds_the_same_records():
    from mqbatch.bench.wire import json_payload

    arr = json.loads(json_payload(3))
    assert [r["seq"] for r in arr] == [0, 1, 2]
    assert arr[2]["r"] == {"temperature": 2, "humidity": 4500, "supply_voltage": 3300, "rssi": -67}


@pytest.mark.broker
def test_bench_wire_quick_prints_the_split_and_writes_json(bench_all_quick):
    """The wire section of the shared `bench all --quick` (tests/bench/conftest.py)."""
    out = bench_all_quick.section("wire")
    baseline = "umqtt.simple not available" not in out
    if not baseline:
        print("umqtt.simple could not be fetched from the package index: its rows are not checked")
    variants = ["mqbatch", "JSON array"] + (["umqtt.simple", "umqtt.simple\\+NODELAY"] if baseline else [])
    for v in variants:
        for b in (1, 10, 100, 500) if not v.startswith("umqtt") else (1,):
            assert re.search(rf"^{v} +{b} +[\d.]+ \[[\d.]+\.\.[\d.]+\] +[\d.]+ ", out, re.M), (
                f"no wire row for {v} batch {b}"
            )
    for b in (1, 10, 100, 500):
        for qos in (0, 1):
            assert re.search(
                rf"^  mqbatch +QoS {qos} batch +{b}: [\d,]+ \[[\d,]+\.\.[\d,]+\] records/s, "
                rf"0\.0 \[0\.0\.\.0\.0\] heap bytes/record$",
                out,
                re.M,
            ), (b, qos)

    doc = json.loads((bench_all_quick.out / "wire.json").read_text())
    assert doc["command"] == bench_all_quick.command("wire", "--quick")
    assert doc["quick"] is True and doc["machine"]["cores"] >= 1 and doc["versions"]["micropython"]
    fig = doc["figures"]
    rows = {(w["variant"], w["batch"]): w for w in fig["wire"]}
    for (variant, batch), w in rows.items():
        parts = w["record"] + w["framing"] + w["mqtt_header"] + w["tls_overhead"] + w["tcpip"]
        assert parts == pytest.approx(w["total"]), (variant, batch, w)
        assert w["tls_overhead"] > 0 and w["tcpip"] > 0 and w["mqtt_header"] > 0, (variant, batch, w)
        assert w["points_from_limit_loopback"] > 0, (variant, batch, w)  # nothing beats the physical limit
        assert w["tls_records_per_publish"] >= 2, (variant, batch, w)  # PUBLISH up, PUBACK down
    for b in (1, 10, 100, 500):
        ours = rows[("mqbatch", b)]
        assert ours["record"] == 38 and ours["framing"] == 1.0  # one VBI byte per 38-byte record
        assert rows[("JSON array", b)]["total"] > ours["total"]
    assert rows[("mqbatch", 500)]["total"] < rows[("mqbatch", 10)]["total"] < rows[("mqbatch", 1)]["total"]
    if baseline:
        assert fig["umqtt_version"]
        umqtt = rows[("umqtt.simple", 1)]
        assert umqtt["record"] == 38 and umqtt["framing"] == 0 and umqtt["total"] > rows[("mqbatch", 1)]["total"]
        assert umqtt["tls_records_per_publish"] > rows[("mqbatch", 1)]["tls_records_per_publish"]
    rates = {(r["client"], r["batch"], r["qos"]) for r in fig["rates"]}
    assert {("mqbatch", b, q) for b in (1, 10, 100, 500) for q in (0, 1)} <= rates
