"""The device MQTT client (firmware/mqb_client.py, run in the MicroPython Unix port)
against a real Mosquitto 2.0, checked by a paho-mqtt subscriber and, for plain-TCP
listeners, by a WireTap that records every packet on the wire."""

from __future__ import annotations

import struct
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.wire.codec import DecodeOptions, decode
from mqbatch_testing.broker import of, run_drive

pytestmark = pytest.mark.broker

TOPIC = "mqbatch/device-1/telemetry"
PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 3, 4, 5, 6, 7


def plan(host, port, steps, *, client=None, tls=None, **kw):
    """A mqtt_drive plan; tls is a dict of Transport TLS arguments, else plain TCP."""
    transport = {"host": host, "port": port}
    transport.update(tls if tls else {"plain_tcp": True})
    c = {"client_id": "device-1", "keepalive": 30}
    c.update(client or {})
    return {"transport": transport, "client": c, "steps": steps, **kw}


def pub(qos=1, batches=1, topic=TOPIC, **kw):
    return ["publish", {"topic": topic, "qos": qos, "batches": batches, **kw}]


def check_batch(payload: bytes, user_properties, batch: int, records=100, size=24):
    """The payload is the batch number `batch` the driver built: decode it with the
    host's reference decoder and compare every record."""
    res = decode(user_properties, payload, DecodeOptions())
    assert res.status == "ok", res
    assert len(res.messages) == records
    for i, m in enumerate(res.messages):
        assert m == struct.pack(">II", batch, i) + bytes([i & 0xFF]) * (size - 8)


def errors(events):
    return of(events, "error")


@pytest.mark.fast
def test_default_broker_qos_0_1_2_with_properties(mosquitto, subscriber, wiretap, tmp_path):
    b = mosquitto()
    sub = subscriber(b, "mqbatch/#", qos=2)
    tap = wiretap(b)
    props = {"expiry": 3600, "content_type": "application/vnd.mqbatch.v1", "payload_format": 0}
    ev = run_drive(
        plan(
            tap.host,
            tap.port,
            [["connect", {}], pub(0, **props), pub(1, **props), pub(2, **props), ["flush", {}], ["disconnect", {}]],
        ),
        tmp_path,
    )
    assert not errors(ev), ev
    (ca,) = of(ev, "connack")
    assert ca["session_present"] is False and ca["topic_alias_max"] == 10 and ca["limit"] == 4
    assert ca["nodelay_error"] is None  # TCP_NODELAY set on the Unix port
    acks = of(ev, "ack")
    assert [(a["pid"], a["code"]) for a in acks] == [(1, 0), (2, 0)]  # QoS 1 PUBACK, QoS 2 PUBCOMP
    msgs = sub.wait_for(3)
    assert len(msgs) == 3 and sorted(m.qos for m in msgs) == [0, 1, 2]
    for m in msgs:
        assert m.topic == TOPIC
        assert m.user_properties == [("batch-format", "v1"), ("batch-size", "100")]
        assert m.content_type == "application/vnd.mqbatch.v1" and m.payload_format == 0
        assert 3590 <= m.message_expiry <= 3600
    for m, p in zip(sorted(msgs, key=lambda m: m.qos), of(ev, "published")):
        check_batch(m.payload, m.user_properties, p["batch"])
    # on the wire: one PUBLISH per batch, exactly the size the client computed
    wire = tap.packets(PUBLISH, "c2s")
    assert [len(f.raw) for f in wire] == [p["size"] for p in of(ev, "published")]
    assert [f.publish_fields()["qos"] for f in wire] == [0, 1, 2]
    assert [f.type for f in tap.closed().packets(direction="c2s")] == [1, 3, 3, 3, PUBREL, 14]
    assert sub.settle() == msgs  # nothing else arrived


def test_small_max_packet_size_is_never_exceeded(mosquitto, wiretap, subscriber, tmp_path):
    limit = 300
    b = mosquitto(max_packet_size=limit)
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b)
    steps = [
        ["connect", {}],
        ["budget", {"topic": TOPIC, "qos": 1}],
        pub(1, batches=4, records=0),
        pub(0, batches=2, records=0),
        ["flush", {}],
        ["budget", {"topic": TOPIC + "/longer-topic-name", "qos": 1}],
        pub(1, batches=2, records=0, topic=TOPIC + "/longer-topic-name"),
        ["flush", {}],
    ]
    ev = run_drive(plan(tap.host, tap.port, steps, client={"alias_slots": 0}), tmp_path)
    assert not errors(ev), ev
    assert of(ev, "connack")[0]["max_packet_size"] == limit
    sizes = [len(f.raw) for f in tap.packets(direction="c2s")]
    assert max(sizes) <= limit, sizes
    published = of(ev, "published")
    assert [len(f.raw) for f in tap.packets(PUBLISH, "c2s")] == [p["size"] for p in published]
    for p in published:  # the budget is tight: one more 24-byte record (+1 length byte) would not fit
        assert limit - 25 < p["size"] <= limit, p
    assert len(sub.wait_for(8)) == 8
    # a batch built without the budget is refused by the client before anything is sent
    n_before = len(tap.packets(PUBLISH))
    ev = run_drive(plan(tap.host, tap.port, [["connect", {}], pub(1, records=100), ["disconnect", {}]]), tmp_path)
    (err,) = errors(ev)
    assert err["code"] == 0x95 and err["local"] and "Maximum Packet Size 300" in err["message"], err
    assert len(tap.packets(PUBLISH)) == n_before


@pytest.mark.parametrize("alias_max", [0, 2])
def test_topic_alias_maximum(alias_max, mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto(max_topic_alias=alias_max)
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b)
    topics = [f"mqbatch/device-1/t{i}" for i in range(3)] * 2
    steps = (
        [["connect", {}]]
        + [pub(1, topic=t) for t in topics]
        + [["flush", {}], ["drop", {}], ["connect", {}], pub(1, topic=topics[0]), ["flush", {}]]
    )
    ev = run_drive(plan(tap.host, tap.port, steps, client={"alias_slots": 4, "session_expiry": 0}), tmp_path)
    assert not errors(ev), ev
    assert all(c["topic_alias_max"] == alias_max for c in of(ev, "connack"))
    seen = [(f.conn, f.publish_fields()) for f in tap.packets(PUBLISH, "c2s")]
    names = [(c, p["topic"], p["props"].get(0x23)) for c, p in seen]
    if alias_max == 0:
        assert all(a is None for _, _, a in names)
        assert [t for _, t, _ in names] == topics + topics[:1]
    else:
        t0, t1, t2 = topics[:3]
        assert names == [
            (0, t0, 1),
            (0, t1, 2),
            (0, t2, None),
            (0, "", 1),
            (0, "", 2),
            (0, t2, None),
            (1, t0, 1),
        ]  # aliases are forgotten on reconnect: the name is sent again
    msgs = sub.wait_for(7)
    assert [m.topic for m in msgs] == topics + topics[:1]


@pytest.mark.parametrize("inflight", [1, 2])
def test_receive_maximum_bounds_messages_in_flight(inflight, mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto(max_inflight_messages=inflight)
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b, hold_acks_until_open=inflight)  # the wire shows the window only if acks wait for it
    steps = [["connect", {}], pub(1, batches=8, service=False), pub(2, batches=6, service=False), ["flush", {}]]
    ev = run_drive(plan(tap.host, tap.port, steps, client={"receive_max": 8}), tmp_path)
    assert not errors(ev), ev
    (ca,) = of(ev, "connack")
    assert ca["receive_max"] == inflight and ca["limit"] == inflight
    (fl,) = of(ev, "flushed")
    assert fl["peak_inflight"] == inflight and fl["inflight"] == 0 and fl["acked"] == 14
    # count on the wire: PUBLISHes sent minus final acknowledgements received
    open_, peak = set(), 0
    for f in tap.packets():
        if f.direction == "c2s" and f.type == PUBLISH:
            open_.add(f.publish_fields()["pid"])
            peak = max(peak, len(open_))
        elif f.direction == "s2c" and f.type in (PUBACK, PUBCOMP):
            open_.discard(int.from_bytes(f.raw[2:4], "big"))
    assert peak == inflight and not open_
    assert len(sub.wait_for(14)) == 14


def test_maximum_qos_0(mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto(max_qos=0)
    sub = subscriber(b, "mqbatch/#", qos=0)
    tap = wiretap(b)
    steps = [["connect", {}], pub(1, **{"continue": True}), pub(0), ["disconnect", {}]]
    ev = run_drive(plan(tap.host, tap.port, steps), tmp_path)
    assert of(ev, "connack")[0]["max_qos"] == 0
    (err,) = errors(ev)
    assert err["code"] == 0x9B and err["local"] and "Maximum QoS is 0" in err["message"]
    sent = tap.closed().packets(PUBLISH, "c2s")  # closed(): no ack says the tap has read a QoS 0 PUBLISH yet
    assert [f.publish_fields()["qos"] for f in sent] == [0]  # the QoS 1 one never left
    assert len(sub.wait_for(1)) == 1


def test_maximum_qos_1(mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto(max_qos=1)
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b)
    steps = [["connect", {}], pub(2, **{"continue": True}), pub(1), ["flush", {}], ["disconnect", {}]]
    ev = run_drive(plan(tap.host, tap.port, steps), tmp_path)
    assert of(ev, "connack")[0]["max_qos"] == 1
    (err,) = errors(ev)
    assert err["code"] == 0x9B and "QoS 2 requested" in err["message"]
    assert [f.publish_fields()["qos"] for f in tap.packets(PUBLISH, "c2s")] == [1]
    assert [a["code"] for a in of(ev, "ack")] == [0]
    assert len(sub.wait_for(1)) == 1


def test_retain_not_available(mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto(retain_available=False)
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b)
    steps = [["connect", {}], pub(1, retain=True, **{"continue": True}), pub(1), ["flush", {}], ["disconnect", {}]]
    ev = run_drive(plan(tap.host, tap.port, steps), tmp_path)
    assert of(ev, "connack")[0]["retain_available"] is False
    (err,) = errors(ev)
    assert err["code"] == 0x9A and err["local"]
    assert [f.publish_fields()["retain"] for f in tap.packets(PUBLISH, "c2s")] == [False]
    assert len(sub.wait_for(1)) == 1
    # a retained Will is refused by the broker itself, in CONNACK
    will = {"topic": "mqbatch/device-1/status", "payload": "offline", "retain": True}
    ev = run_drive(plan(b.host, b.port, [["connect", {}]], client={"will": will}), tmp_path)
    (err,) = errors(ev)
    assert err["packet"] == "CONNACK" and err["code"] == 0x9A and not err["local"], err


def test_will_with_properties_is_published_when_link_drops(mosquitto, subscriber, tmp_path):
    b = mosquitto()
    sub = subscriber(b, "mqbatch/device-1/status")
    will = {
        "topic": "mqbatch/device-1/status",
        "payload": "offline",
        "qos": 1,
        "retain": True,
        "expiry": 600,
        "content_type": "text/plain",
        "payload_format": 1,
    }
    ev = run_drive(plan(b.host, b.port, [["connect", {}], ["drop", {}]], client={"will": will}), tmp_path)
    assert not errors(ev)
    (m,) = sub.wait_for(1)
    assert (m.payload, m.content_type, m.payload_format) == (b"offline", "text/plain", 1)
    assert 590 <= m.message_expiry <= 600


def test_tls_with_ca_pem_and_der(mosquitto, subscriber, pki, tmp_path):
    b = mosquitto(tls=True)
    sub = subscriber(b, "mqbatch/#")
    for ca in (pki.ca_cert, pki.ca.cert_der):
        tls = {"cafile": str(ca), "server_hostname": "localhost"}
        ev = run_drive(
            plan(b.host, b.port, [["connect", {}], pub(1), ["flush", {}], ["disconnect", {}]], tls=tls), tmp_path
        )
        assert not errors(ev), ev
        assert [a["code"] for a in of(ev, "ack")] == [0]
    msgs = sub.wait_for(2)
    assert len(msgs) == 2
    check_batch(msgs[0].payload, msgs[0].user_properties, 0)


@pytest.mark.parametrize("case, kind", [("wrong-ca", "untrusted"), ("hostname", "hostname"), ("expired", "expired")])
def test_tls_failures_are_named_and_nothing_is_sent(case, kind, mosquitto, pki, tmp_path):
    if case == "expired":
        b = mosquitto(tls=True, certfile=pki.expired_server.cert, keyfile=pki.expired_server.key)
    else:
        b = mosquitto(tls=True)
    tls = {
        "cafile": str(pki.other_ca.cert if case == "wrong-ca" else pki.ca_cert),
        "server_hostname": "wrong.example" if case == "hostname" else "localhost",
    }
    ev = run_drive(plan(b.host, b.port, [["connect", {}], pub(1)], tls=tls), tmp_path)
    (err,) = errors(ev)
    assert err["type"] == "TLSError" and err["kind"] == kind, err
    want = {
        "untrusted": "not signed by the configured CA",
        "hostname": "does not match the server name",
        "expired": "has expired",
    }[kind]
    assert want in err["message"], err["message"]
    assert not of(ev, "connack") and not of(ev, "published")
    time.sleep(0.2)
    assert "New client connected" not in b.logs()  # no CONNECT (or anything else) got through


def test_mutual_tls_identity_as_username_and_acl(mosquitto, subscriber, pki, tmp_path):
    acl = "pattern write mqbatch/%u/telemetry\nuser reader\ntopic read mqbatch/#\n"
    b = mosquitto(tls=True, require_certificate=True, use_identity_as_username=True, allow_anonymous=False, acl=acl)
    reader = pki.client("reader")
    sub = subscriber(b, "mqbatch/#", certfile=reader.cert, keyfile=reader.key)
    dev = pki.client("device-1")
    tls = {
        "cafile": str(pki.ca_cert),
        "certfile": str(dev.cert_der),
        "keyfile": str(dev.key),
        "server_hostname": "localhost",
    }
    other = "mqbatch/device-2/telemetry"
    ev = run_drive(
        plan(
            b.host, b.port, [["connect", {}], pub(1), pub(1, topic=other), ["flush", {}], ["disconnect", {}]], tls=tls
        ),
        tmp_path,
    )
    assert not errors(ev), ev
    assert [a["code"] for a in of(ev, "ack")] == [0, 0x87]  # own topic ok; another device's: Not authorized
    assert [m.topic for m in sub.settle()] == [TOPIC]
    assert "u'device-1'" in b.logs()
    # without a client certificate the broker ends the TLS session: reported, nothing published
    ev = run_drive(
        plan(b.host, b.port, [["connect", {}]], tls={"cafile": str(pki.ca_cert), "server_hostname": "localhost"}),
        tmp_path,
    )
    (err,) = errors(ev)
    assert err["type"] in ("TransportError", "TLSError") and not of(ev, "connack"), err


@pytest.mark.fast
def test_password_file_and_acl_limit_each_device_to_its_topic(mosquitto, subscriber, tmp_path):
    acl = "pattern write mqbatch/%u/telemetry\nuser reader\ntopic read mqbatch/#\n"
    b = mosquitto(allow_anonymous=False, users={"device-1": "pw-1", "device-2": "pw-2", "reader": "pw-r"}, acl=acl)
    sub = subscriber(b, "mqbatch/#", username="reader", password="pw-r")
    creds = {"username": "device-1", "password": "pw-1"}
    steps = [
        ["connect", {}],
        pub(1),
        pub(1, topic="mqbatch/device-2/telemetry"),
        pub(0, topic="mqbatch/device-2/telemetry"),
        ["flush", {}],
        ["drop", {}],
        ["connect", {}],
        ["disconnect", {}],
    ]
    ev = run_drive(plan(b.host, b.port, steps, client={**creds, "session_expiry": 60}), tmp_path)
    assert not errors(ev), ev
    acks = of(ev, "ack")
    assert [a["code"] for a in acks] == [0, 0x87]
    # refused messages are final: nothing is waiting to be resent in the resumed session
    assert of(ev, "connack")[1]["session_present"] is True and of(ev, "connack")[1]["pending_resend"] == []
    assert [m.topic for m in sub.settle()] == [TOPIC]
    ev = run_drive(
        plan(b.host, b.port, [["connect", {}]], client={"username": "device-1", "password": "wrong"}), tmp_path
    )
    (err,) = errors(ev)
    assert err["packet"] == "CONNACK" and err["code"] in (0x86, 0x87) and not err["local"], err
    ev = run_drive(plan(b.host, b.port, [["connect", {}]], client={"client_id": "anon"}), tmp_path)
    assert errors(ev)[0]["code"] in (0x86, 0x87)


def test_refused_message_is_reported_and_never_resent(mosquitto, wiretap, subscriber, tmp_path):
    acl = "pattern write mqbatch/%u/telemetry\nuser reader\ntopic read mqbatch/#\n"
    b = mosquitto(allow_anonymous=False, users={"device-1": "pw-1", "reader": "pw-r"}, acl=acl)
    sub = subscriber(b, "mqbatch/#", username="reader", password="pw-r")
    tap = wiretap(b)
    other = "mqbatch/device-2/telemetry"
    steps = [
        ["connect", {}],
        pub(1, topic=other),
        pub(1),
        ["flush", {}],
        ["drop", {}],
        ["connect", {}],
        ["flush", {}],
        ["disconnect", {}],
    ]
    ev = run_drive(
        plan(tap.host, tap.port, steps, client={"session_expiry": 60, "username": "device-1", "password": "pw-1"}),
        tmp_path,
    )
    assert not errors(ev), ev
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, 0x87), (2, 0)]
    c2 = of(ev, "connack")[1]
    assert c2["session_present"] is True and c2["pending_resend"] == []
    assert [f.publish_fields()["topic"] for f in tap.packets(PUBLISH, "c2s")] == [other, TOPIC]  # sent once
    assert [m.topic for m in sub.settle()] == [TOPIC]


def test_session_taken_over_is_reported_as_closed_link(mosquitto, tmp_path):
    b = mosquitto()
    usurper = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="device-1", protocol=mqtt.MQTTv5)

    def on_event(e):
        if e["event"] == "mark":
            usurper.connect(b.host, b.port)
            usurper.loop_start()

    try:
        ev = run_drive(
            plan(b.host, b.port, [["connect", {}], ["mark", {"name": "connected"}], ["service_for", {"ms": 10000}]]),
            tmp_path,
            on_event=on_event,
        )
    finally:
        usurper.loop_stop()
        usurper.disconnect()
    # Mosquitto 2.0.11 closes the old connection without a DISCONNECT 0x8E (seen on the
    # wire); the client reports the closed link. DISCONNECT 0x8E itself: test_mqtt_fake_server.
    (err,) = errors(ev)
    assert err["type"] == "TransportError" and "connection closed by the broker" in err["message"], err
    assert ev[-1]["connected"] is False
    assert "already connected, closing old connection" in b.logs()


def test_dead_link_is_detected_by_keep_alive(mosquitto, tmp_path):
    b = mosquitto()

    def on_event(e):
        if e["event"] == "mark":
            b.suspend()  # TCP stays up, nothing answers

    steps = [["connect", {}], ["service_for", {"ms": 2500}], ["mark", {"name": "hang"}], ["service_for", {"ms": 15000}]]
    t0 = time.monotonic()
    try:
        ev = run_drive(plan(b.host, b.port, steps, client={"keepalive": 2}), tmp_path, on_event=on_event)
    finally:
        b.resume()
    serviced = of(ev, "serviced")
    assert serviced[0]["pings"] >= 1 and serviced[0]["connected"]  # PINGREQ when idle, answered
    (err,) = errors(ev)
    assert err["code"] == 0x8D and err["packet"] == "PINGRESP" and err["local"], err
    assert "link is dead" in err["message"]
    assert time.monotonic() - t0 < 15  # detected well before the 15 s step ended


def test_unacknowledged_messages_resent_with_dup_only_after_session_present(mosquitto, wiretap, subscriber, tmp_path):
    b = mosquitto()
    sub = subscriber(b, "mqbatch/#")
    tap = wiretap(b)
    # 1) publish two QoS 1 batches and lose the link before reading the PUBACKs; resume the session
    steps = [
        ["connect", {}],
        pub(1, batches=2, service=False),
        ["drop", {}],
        ["connect", {}],
        ["resend", {"topic": TOPIC, "pid_to_batch": {"1": 0, "2": 1}}],
        ["flush", {}],
        ["disconnect", {}],
    ]
    ev = run_drive(plan(tap.host, tap.port, steps, client={"session_expiry": 300}), tmp_path)
    assert not errors(ev), ev
    c1, c2 = of(ev, "connack")
    assert c1["session_present"] is False and c2["session_present"] is True and c2["pending_resend"] == [1, 2]
    wire = [(f.conn, f.publish_fields()) for f in tap.packets(PUBLISH, "c2s")]
    first = [(p["pid"], p["dup"]) for c, p in wire if c == 0]
    assert first == [(1, False), (2, False)][: len(first)]  # (what the RST did not discard)
    assert [(c, p["pid"], p["dup"]) for c, p in wire if c == 1] == [(1, 1, True), (1, 2, True)]
    for _c, p in wire:
        check_batch(p["payload"], p["props"]["user"], p["pid"] - 1)  # the resend carries the same batch
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, 0), (2, 0)]
    # QoS 1 is at least once: each batch arrives, possibly twice (the host de-duplicates by
    # record id). The first copies may be lost with the link: closing a socket with unread
    # PUBACKs sends a TCP RST, which discards data still queued at the receiver.
    got = sub.wait_for(4, timeout=5)
    assert 2 <= len(got) <= 4 and {struct.unpack(">I", m.payload[1:5])[0] for m in got} == {0, 1}
    for m in got:
        check_batch(m.payload, m.user_properties, struct.unpack(">I", m.payload[1:5])[0])
    # 2) the same loss, but the reconnect starts a new session: nothing is resent with DUP,
    #    the application is told to publish again
    n = len(tap.packets(PUBLISH))
    steps = [
        ["connect", {}],
        pub(1, service=False),
        ["drop", {}],
        ["connect", {"clean_start": True}],
        ["flush", {}],
        ["disconnect", {}],
    ]
    ev = run_drive(plan(tap.host, tap.port, steps, client={"session_expiry": 300, "client_id": "device-1b"}), tmp_path)
    assert not errors(ev), ev
    assert [c["session_present"] for c in of(ev, "connack")] == [False, False]
    assert [(a["pid"], a["code"]) for a in of(ev, "ack")] == [(1, -3)]  # SESSION_LOST
    assert not any(f.publish_fields()["dup"] for f in tap.packets(PUBLISH)[n:])


def test_broker_restart_resumes_persistent_session(mosquitto, tmp_path):
    b = mosquitto(persistence=True)

    def on_event(e):
        if e["event"] == "mark":
            b.restart()  # graceful: the session is saved and reloaded, same port

    # Mosquitto 2.0.11 writes a v5 session to its persistence file only if that connection
    # had Clean Start 0, so the device's first (clean) connection is followed by a resume.
    steps = [
        ["connect", {}],
        ["drop", {}],
        ["connect", {}],
        pub(1),
        ["flush", {}],
        ["mark", {"name": "restart"}],
        ["service_for", {"ms": 5000, "continue": True}],
        ["connect", {"retry_ms": 10000}],
        pub(1),
        ["flush", {}],
        ["disconnect", {}],
    ]
    ev = run_drive(plan(b.host, b.port, steps, client={"session_expiry": 300}), tmp_path, on_event=on_event)
    (err,) = errors(ev)  # the outage is reported, not hidden
    assert err["step"] == "service_for" and err["type"] in ("TransportError", "MQTTError"), err
    assert [c["session_present"] for c in of(ev, "connack")] == [False, True, True]
    assert [a["code"] for a in of(ev, "ack")] == [0x10, 0x10]  # no subscriber: "No matching subscribers"


def test_device_subscribes_to_its_ack_topic_and_receives_paho_publishes(mosquitto, wiretap, tmp_path):
    """firmware/mqb_sub.py against Mosquitto: SUBSCRIBE granted QoS 1, then what a paho
    client publishes to the ack topic (QoS 1 and 0) reaches the device's callback and
    the QoS 1 one is PUBACKed with its packet id (seen on the wire)."""
    b = mosquitto()
    tap = wiretap(b)
    ack_topic = "mqbatch/device-1/ack"
    payloads = [b"\x01" + struct.pack("<III", 3, 0, 99), b"\x01" + struct.pack("<III", 3, 100, 199)]
    acker = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="acker", protocol=mqtt.MQTTv5)
    acker.connect(b.host, b.port)
    acker.loop_start()
    sent = []

    def on_event(ev):
        if ev["event"] == "suback":
            sent.append(acker.publish(ack_topic, payloads[0], qos=1))
            sent.append(acker.publish(ack_topic, payloads[1], qos=0))

    try:
        ev = run_drive(
            plan(
                tap.host,
                tap.port,
                [["connect", {}], ["service_for", {"ms": 2500}], ["disconnect", {}]],
                client={"max_packet_size": 900, "session_expiry": 0},
                subscribe=ack_topic,
            ),
            tmp_path,
            on_event=on_event,
        )
        for info in sent:
            info.wait_for_publish(5)
    finally:
        acker.loop_stop()
        acker.disconnect()
    assert not errors(ev), ev
    assert [e["code"] for e in of(ev, "suback")] == [1]
    got = [(m["topic"], bytes.fromhex(m["payload"])) for m in of(ev, "message")]
    assert got == [(ack_topic, payloads[0]), (ack_topic, payloads[1])], got
    s2c = [f for f in tap.packets(PUBLISH, "s2c")]
    assert [f.publish_fields()["qos"] for f in s2c] == [1, 0]
    assert [f.type for f in tap.closed().packets(direction="c2s")] == [
        1,
        8,
        PUBACK,
        14,
    ]  # CONNECT SUBSCRIBE PUBACK DISCONNECT
    (puback,) = tap.packets(PUBACK, "c2s")
    assert puback.raw[2:4] == s2c[0].publish_fields()["pid"].to_bytes(2, "big")
