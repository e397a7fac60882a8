"""The device application (firmware/mqb_app.py) as virtual devices: real MicroPython
Unix-port processes running the compiled firmware, a real Mosquitto with TLS,
passwords and per-device ACLs, and a paho-mqtt subscriber checking what arrived."""

from __future__ import annotations

import re
import signal
import time

import pytest

from mqbatch.lab.devices import Fleet
from mqbatch.wire import codec, records
from mqbatch_testing import ROOT

READER = ("reader", "reader-pw")
ACL = "user reader\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n"


def secured_broker(mosquitto, creds, **options):
    return mosquitto(
        tls=True, allow_anonymous=False, users={**creds, READER[0]: READER[1]}, acl=ACL, persistence=True, **options
    )


def delivered(messages) -> tuple[set, list, dict]:
    """(device, boot, seq) of every record delivered, the duplicates, and kinds per device."""
    seen: set = set()
    dups: list = []
    kinds: dict = {}
    for m in messages:
        if not m.topic.endswith("/telemetry"):
            continue
        res = codec.decode(m.user_properties, m.payload, topic=m.topic)
        assert res.status == codec.OK, res.log
        dev = records.device_from_topic(m.topic)
        for sub in res.messages:
            rec = records.parse(sub)
            key = (dev, rec.boot, rec.seq)
            (dups.append(key) if key in seen else seen.add(key))
            kinds.setdefault(dev, []).append(rec.kind)
    return seen, dups, kinds


def durable_subscriber(subscriber, broker):
    """The witness: a persistent-session subscriber (see mqbatch_testing.broker.Subscriber)."""
    return subscriber(
        broker, "mqbatch/#", username=READER[0], password=READER[1], client_id="durable-reader", persistent=True
    )


def fleet_config(**over):
    cfg = {
        "sample_hz": 20,
        "run_for_s": 4,
        "drain_timeout_s": 30,
        "health_every_s": 1,
        "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 1000},
        "backoff": {"initial_ms": 200, "max_ms": 2000},
    }
    cfg.update(over)
    return cfg


@pytest.mark.fast
@pytest.mark.parametrize("record_format", ["binary", "json"])
def test_devices_deliver_every_stored_record_over_tls(mosquitto, subscriber, pki, tmp_path, record_format):
    creds = {"dev-001": "pw-1", "dev-002": "pw-2"}
    broker = secured_broker(mosquitto, creds)
    sub = subscriber(broker, "mqbatch/#", username=READER[0], password=READER[1])
    with Fleet(
        tmp_path / "fleet",
        broker.host,
        broker.port,
        credentials=creds,
        ca=pki.ca_cert,
        heapsize="64K",
        config=fleet_config(record_format=record_format),
    ) as fleet:
        fleet.start()
        codes = fleet.wait(90)
        assert codes == {"dev-001": 0, "dev-002": 0}, {d: fleet.console(d)[-2000:] for d in creds}
        sums = fleet.summaries()
        stored = fleet.stored()
    msgs = sub.settle(quiet=1.0)
    got, dups, kinds = delivered(msgs)
    formats = {
        records.parse(x).format
        for m in msgs
        if m.topic.endswith("/telemetry")
        for x in codec.decode(m.user_properties, m.payload).messages
    }
    assert formats == {record_format}
    # e2e acks off (no e2e_ack in the config): no batch-seq property (docs/e2e-ack.md)
    assert not [k for m in msgs for k, _ in m.user_properties if k == "batch-seq"]
    assert stored and got == stored  # every stored record arrived, nothing else
    assert dups == []  # an undisturbed run sends each batch once
    for dev in creds:
        s = sums[dev]
        assert s["outbox_depth"] == 0 and s["acked_records"] == s["stored_records"] == s["next_seq"]
        assert s["sampled"] >= 60 and s["dropped_total"] == 0 and s["last_error"] == 0
        assert kinds[dev].count(records.HEALTH) >= 3
    # the will: nothing published on status while devices disconnected cleanly
    assert not [m for m in sub.messages if m.topic.endswith("/status")]


def test_device_refused_by_acl_on_foreign_topic_reports_it(mosquitto, subscriber, pki, tmp_path):
    """A device whose topic is outside its ACL never gets success: the error is reported, not swallowed."""
    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    cfg = fleet_config(run_for_s=2, drain_timeout_s=3, topic="mqbatch/dev-999/telemetry")
    with Fleet(
        tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, heapsize="64K", config=cfg
    ) as fleet:
        fleet.start()
        assert fleet.wait(60) == {"dev-001": 0}, fleet.console("dev-001")[-3000:]
        s = fleet.summaries()["dev-001"]
        console = fleet.console("dev-001")
    # Mosquitto answers an ACL-denied QoS 1 PUBLISH with PUBACK 0x87 (Not authorized)
    assert s["acked_records"] == 0 and s["refused_batches"] >= 1 and s["last_error"] == 0x87, console
    assert "0x87" in console and s["dropped_total"] == s["stored_records"]


@pytest.mark.slow
def test_broker_outage_of_30s_in_a_64k_heap_loses_nothing(mosquitto, subscriber, pki, tmp_path):
    """The whole application as .mpy (ROMFS, outside the heap) in `micropython -X heapsize=64K`,
    TLS, 10 Hz, a 30 s broker outage: no MemoryError, every stored record delivered.
    The 10-minute version is tools/soak_app.py (docs/application.md, Memory)."""
    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    sub = durable_subscriber(subscriber, broker)
    cfg = fleet_config(sample_hz=10, run_for_s=45, drain_timeout_s=60, health_every_s=5)
    with Fleet(
        tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, heapsize="64K", config=cfg
    ) as fleet:
        fleet.start()
        time.sleep(5)
        broker.stop()
        time.sleep(30)
        broker.start()
        # the reference subscriber reconnects on its own (paho loop); give it a moment
        codes = fleet.wait(120)
        s = fleet.summaries().get("dev-001", {})
        stored = fleet.stored()
        console = fleet.console("dev-001")
    got, dups, kinds = delivered(sub.settle(quiet=2.0, timeout=30))
    sub.close()
    assert codes == {"dev-001": 0} and "MemoryError" not in console, console[-3000:]
    assert s["reconnects"] >= 1, console
    missing = stored - got
    assert stored and not missing, f"{len(missing)} stored records never arrived, e.g. {sorted(missing)[:5]}"
    assert s["outbox_depth"] == 0 and s["dropped_total"] == 0
    # 45 s at 10 Hz, sampling went on during the outage
    assert s["sampled"] >= 400, s
    # live heap is measured after gc.collect(): within the heap, below the peak with garbage
    assert 30_000 < s["peak_heap_live"] <= s["peak_heap"] <= 64 * 1024, s
    assert kinds["dev-001"].count(records.HEALTH) >= 8
    print(
        f"64K heap: peak_heap_live {s['peak_heap_live']} B, peak_heap {s['peak_heap']} B (incl. garbage), "
        f"{len(stored)} records stored and delivered, {len(dups)} duplicates, {s['reconnects']} reconnects"
    )


def test_sigkill_while_writing_outbox_then_reboot_delivers_all_stored(mosquitto, subscriber, pki, tmp_path):
    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    sub = durable_subscriber(subscriber, broker)
    # batches sealed every 5 records at 50 Hz: the outbox is written ~10 times a second
    cfg = fleet_config(sample_hz=50, run_for_s=6, flush={"max_count": 5, "max_bytes": 2048, "max_age_ms": 1000})
    with Fleet(
        tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, heapsize="64K", config=cfg
    ) as fleet:
        fleet.start()
        time.sleep(1.0)
        broker.stop()  # nothing can be acknowledged: the outbox only grows
        time.sleep(1.5)
        fleet.kill("dev-001", signal.SIGKILL)
        before_kill = fleet.stored()
        broker.start()
        fleet.start_device("dev-001")  # reboot: boot 2 resends boot 1's outbox
        assert fleet.wait(90) == {"dev-001": 0}, fleet.console("dev-001")[-3000:]
        s = fleet.summaries()["dev-001"]
        console = fleet.console("dev-001")
    got, dups, _ = delivered(sub.settle(quiet=2.0, timeout=30))
    sub.close()
    assert {b for _, b, _ in before_kill} == {1} and len(before_kill) >= 20, console
    assert before_kill <= got, f"lost after SIGKILL: {sorted(before_kill - got)[:5]}"
    assert s["boot"] == 2 and s["outbox_depth"] == 0
    print(
        f"SIGKILL test: {len(before_kill)} records stored before the kill, all delivered; "
        f"{len(dups)} duplicates delivered (allowed)"
    )


def test_puback_0x10_no_subscribers_keeps_the_batch_until_someone_listens(mosquitto, subscriber, pki, tmp_path):
    """Mosquitto answers PUBACK 0x10 when nobody subscribes (e.g. the recorder's shared
    subscription is not back yet after a restart): a success code in MQTT, but the
    batch reached nobody. The device keeps it and sends it again; nothing is lost."""
    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    cfg = fleet_config(run_for_s=8, drain_timeout_s=40, backoff={"initial_ms": 200, "max_ms": 1000})
    with Fleet(tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, config=cfg) as fleet:
        fleet.start()
        time.sleep(4)  # no subscriber yet: every PUBACK so far is 0x10
        sub = durable_subscriber(subscriber, broker)
        assert fleet.wait(90) == {"dev-001": 0}, fleet.console("dev-001")[-3000:]
        s = fleet.summaries()["dev-001"]
        stored = fleet.stored()
        console = fleet.console("dev-001")
    got, _, _ = delivered(sub.settle(quiet=2.0, timeout=30))
    sub.close()
    assert s["no_subscribers"] >= 1 and "No matching subscribers" in console, console[-2000:]
    assert stored and stored <= got, f"lost: {sorted(stored - got)[:5]}"
    assert s["drained"] and s["dropped_total"] == 0


def test_batches_stored_larger_than_the_new_buffer_are_split_not_lost(mosquitto, subscriber, pki, tmp_path):
    """A device reboots with a smaller flush.max_bytes than the batches in its outbox:
    they are read into a scratch buffer and stored again in batches that fit."""
    import json

    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    sub = durable_subscriber(subscriber, broker)
    broker.stop()  # first run: nothing can be sent, big batches pile up
    cfg = fleet_config(
        sample_hz=50, run_for_s=4, drain_timeout_s=1, flush={"max_count": 100, "max_bytes": 2048, "max_age_ms": 2000}
    )
    with Fleet(tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, config=cfg) as fleet:
        fleet.start()
        assert fleet.wait(60) == {"dev-001": 1}  # ended with an undelivered outbox: exit 1
        first = fleet.summaries()["dev-001"]
        assert first["outbox_depth"] >= 2 and not first["drained"]
        path = fleet.dir("dev-001") / "config.json"
        conf = json.loads(path.read_text())
        conf["flush"]["max_bytes"] = 512
        conf.update(run_for_s=1, drain_timeout_s=40)
        path.write_text(json.dumps(conf))
        broker.start()
        fleet.start_device("dev-001")
        assert fleet.wait(90) == {"dev-001": 0}, fleet.console("dev-001")[-3000:]
        stored = fleet.stored()
        console = fleet.console("dev-001")
    got, _, _ = delivered(sub.settle(quiet=2.0, timeout=30))
    sub.close()
    assert "re-stored in smaller batches" in console, console[-3000:]
    assert stored <= got, f"lost: {sorted(stored - got)[:5]}"


def test_disconnect_0x9c_use_another_server_moves_the_device(mosquitto, subscriber, tmp_path):
    """A broker that answers DISCONNECT 0x9C Use another server with a Server Reference
    sends the device to that server (a fake first server, a real Mosquitto second)."""
    from mqbatch_testing.fake_server import CONNACK_OK, FakeServer, packet, props, string

    target = mosquitto(tls=False)
    sub = subscriber(target, "mqbatch/#")
    ref = f"127.0.0.1:{target.port}"

    def move_on(c):
        c.expect(1)  # CONNECT
        c.send(CONNACK_OK)
        c.send(packet(0xE0, b"\x9c" + props(string(0x1F, "maintenance"), string(0x1C, ref))))

    fake = FakeServer([move_on])
    try:
        with Fleet(
            tmp_path / "fleet",
            "127.0.0.1",
            fake.port,
            credentials={"dev-001": "pw"},
            tls=False,
            config=fleet_config(run_for_s=3),
        ) as fleet:
            fleet.start()
            assert fleet.wait(60) == {"dev-001": 0}, fleet.console("dev-001")[-3000:]
            assert "dev-001" in fleet.summaries()  # the device wrote its summary
            stored = fleet.stored()
            console = fleet.console("dev-001")
    finally:
        fake.close()
    assert f"server reference: next connect goes to {ref}" in console, console[-2000:]
    assert "0x9C" in console and "maintenance" in console
    got, _, _ = delivered(sub.settle(quiet=1.0))
    assert stored and stored <= got


def test_signing_e2e_device_in_a_deep_host_directory_runs_in_68k(mosquitto, subscriber, pki, tmp_path):
    """The unix board's flash directory is relative ("."), as short as "/" on a board: the
    host directory a virtual device runs in never reaches the heap. (The heap was 64K until
    issue 22: end-to-end flow control sized by the outbox keeps 21 B per outbox entry, 2,688 B
    for this template's 128 entries, and this signing e2e device no longer starts in 64K:
    MemoryError at the TLS handshake; it now runs in 68K. Devices without e2e
    acks still run in 64K: test_broker_outage_of_30s_in_a_64k_heap_loses_nothing and the
    Maximum Packet Size tests.) With os.getcwd()
    a ~100-character run directory (`mqbatch fleet run` under pytest's tmp_path) left no
    free 752-byte run at start-up: MemoryError in App.__init__, the board boot-looped."""
    import json

    from mqbatch.util.paths import ROOT

    creds = {"kitchen-1": "pw-1"}
    broker = secured_broker(mosquitto, creds)
    sub = durable_subscriber(subscriber, broker)
    template = json.loads((ROOT / "boards" / "unix" / "config.template.json").read_text())
    for k in ("device_id", "broker"):
        template.pop(k)
    deep = tmp_path / ("d" * 40) / ("e" * 40)  # mpy-cross refuses paths over 255
    with Fleet(
        deep,
        broker.host,
        broker.port,
        credentials=creds,
        ca=pki.ca_cert,
        heapsize="68K",
        config=dict(template, run_for_s=2.0),
        hmac_keys={"kitchen-1": bytes(range(32))},
    ) as fleet:
        assert len(str(fleet.dir("kitchen-1"))) > 150
        fleet.start()
        codes = fleet.wait(60)
        console = fleet.console("kitchen-1")
        s = fleet.summaries().get("kitchen-1", {})
    assert codes == {"kitchen-1": 0} and "MemoryError" not in console, console[-2000:]
    assert s["stored_records"] >= 10 and s["acked_records"] == s["stored_records"] and s["outbox_depth"] == 0
    got, dups, _ = delivered(sub.settle(quiet=1.0))
    assert len(got) == s["stored_records"] and dups == []


# 111: the smallest at which the unix board's 38-byte sample record fits a batch (72 bytes
# of PUBLISH header, topic and properties, 1 spare); HEALTH_FITS: the first at which the
# health record (its size read from the firmware: 58 bytes since channel 0x87) does
HEALTH_SIZE = int(
    re.search(r"_HEALTH_SIZE = const\((\d+)\)", (ROOT / "firmware" / "mqb_flush.py").read_text()).group(1)  # type: ignore[union-attr]
)
_HEALTH_REMAINING = 111 - 2 - 38 + HEALTH_SIZE  # the PUBLISH's remaining length with the health record
HEALTH_FITS = 1 + (1 if _HEALTH_REMAINING < 128 else 2) + _HEALTH_REMAINING  # fixed header byte + its VBI


@pytest.mark.parametrize("max_packet_size", [111, 120, HEALTH_FITS - 1, HEALTH_FITS, 600])
def test_every_maximum_packet_size_from_the_smallest_usable_one(mosquitto, subscriber, pki, tmp_path, max_packet_size):
    """Issue 21: at a broker Maximum Packet Size where a record can never fit a batch
    (the health record below HEALTH_FITS), the device refuses it with a named line and
    counts it (too_large), never crashes or reboots, and every record it stored is
    delivered or counted dropped (records stored before the first CONNACK told it the limit)."""
    creds = {"dev-001": "pw-1"}
    broker = secured_broker(mosquitto, creds, max_packet_size=max_packet_size)
    sub = durable_subscriber(subscriber, broker)
    with Fleet(
        tmp_path / "fleet",
        broker.host,
        broker.port,
        credentials=creds,
        ca=pki.ca_cert,
        heapsize="64K",
        config=fleet_config(run_for_s=3),
    ) as fleet:
        fleet.start()
        codes = fleet.wait(90)
        console = fleet.console("dev-001")
        assert codes == {"dev-001": 0}, console[-3000:]
        s = fleet.summaries()["dev-001"]
        stored = fleet.stored()
    assert "Traceback" not in console and "fatal" not in console.lower(), console[-3000:]
    msgs = sub.settle(quiet=1.0)
    got, dups, kinds = delivered(msgs)
    assert got <= stored and len(stored - got) == s["dropped_total"], (s, console[-2000:])
    assert s["outbox_depth"] == 0 and not dups, s
    assert max(len(m.payload) for m in msgs if m.topic.endswith("/telemetry")) <= max_packet_size
    health_fits = max_packet_size >= HEALTH_FITS
    if health_fits:
        assert s["too_large"] == s["dropped_total"] == 0 and records.HEALTH in kinds["dev-001"], s
    else:
        assert s["too_large"] >= s["dropped_total"] and s["too_large"] > 0, s
        assert records.HEALTH not in kinds.get("dev-001", []), s
        assert f"health record of {HEALTH_SIZE} bytes can never fit" in console, console[-2000:]
    assert s["sampled"] >= 30 and s["stored_records"] == len(stored), s
