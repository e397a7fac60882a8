"""`mqbatch ingest` against a real Mosquitto (TLS, password auth, ACL, persistence),
with paho-mqtt publishing: exact landing, SIGKILL mid-stream loses nothing,
shared subscriptions split the load, and a recorded run through the Spark job."""

from __future__ import annotations

import json
import pathlib
import ssl
import threading
import time

import paho.mqtt.client as mqtt
import pyarrow.parquet as pq
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.ingest import landing
from mqbatch.lab import recproc
from mqbatch.wire import codec, records
from mqbatch_testing import run_mpy

pytestmark = pytest.mark.broker

USERS = {"recorder": "rec-secret", "publisher": "pub-secret"}
ACL = "user recorder\ntopic read mqbatch/#\n\nuser publisher\ntopic write mqbatch/#\n"


@pytest.fixture
def broker(mosquitto):
    # max_queued_messages 0: no cap on what the broker keeps for a recorder that is down
    return mosquitto(
        tls=True, allow_anonymous=False, users=USERS, acl=ACL, persistence=True, extra=["max_queued_messages 0"]
    )


class RecorderProcess(recproc.RecorderProcess):
    """`mqbatch ingest` as a child process with this module's recorder account, its output in a file."""

    def __init__(self, broker, pki, landing_dir: pathlib.Path, client_id: str = "rec-1", *extra: str):
        pw = landing_dir.parent / "recorder.pw"
        pw.write_text(USERS["recorder"])
        super().__init__(
            landing_dir.parent / f"{client_id}.log",
            host=broker.host,
            port=broker.port,
            cafile=pki.ca_cert,
            landing=landing_dir,
            client_id=client_id,
            username="recorder",
            password_file=pw,
            extra=extra,
        )


@pytest.fixture
def recorders(broker, pki, tmp_path):
    made = []

    def factory(client_id="rec-1", *extra, landing_dir=None, on=None):
        r = RecorderProcess(on or broker, pki, landing_dir or tmp_path / "landing", client_id, *extra)
        made.append(r)
        return r

    yield factory
    for r in made:
        r.close()
        print(f"--- recorder log {r.log.name} ---\n{r.output()[-3000:]}")


def publisher(broker, pki, client_id="pub-1") -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(pki.ca_cert), cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set("publisher", USERS["publisher"])
    c.max_inflight_messages_set(100)
    connected = threading.Event()
    c.on_connect = lambda client, userdata, flags, rc, props: connected.set()
    c.connect(broker.host, broker.port, keepalive=30, clean_start=True)
    c.loop_start()
    assert connected.wait(10), "publisher could not connect"
    return c


def publish(client, topic, payload, user_properties=(), timeout=30, **props):
    p = Properties(PacketTypes.PUBLISH)
    for k, v in user_properties:
        p.UserProperty = (k, v)
    for name, value in props.items():
        setattr(p, name, value)
    info = client.publish(topic, payload, qos=1, properties=p)
    info.wait_for_publish(timeout)  # the broker acknowledged it (PUBACK)
    return info


def wait_acked(broker, client_id: str, n: int, timeout: float = 30.0) -> None:
    """Until the broker logged n PUBACKs from the recorder (it then considers them delivered)."""
    deadline = time.monotonic() + timeout
    while broker.logs().count(f"Received PUBACK from {client_id} ") < n:
        assert time.monotonic() < deadline, f"broker saw fewer than {n} PUBACKs from {client_id}"
        time.sleep(0.05)


def landed_rows(landing_dir: pathlib.Path) -> list[dict]:
    return landing.read_landing(landing_dir).to_pylist()


def wait_landed(landing_dir, predicate, timeout=60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = landed_rows(landing_dir)
        if predicate(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


# -- tests --------------------------------------------------------------------------


def test_every_publish_is_landed_unchanged(broker, pki, recorders, tmp_path):
    rec = recorders("rec-1", "--filter", "mqbatch/#").start()
    pub = publisher(broker, pki)
    sent = [
        (
            "mqbatch/dev-1/telemetry",
            codec.encode_payload([b"a", b"bc"]),
            [("batch-format", "v1"), ("x", "1"), ("x", "2"), ("batch-size", "2")],
            {"ContentType": "application/vnd.mqbatch.v1", "PayloadFormatIndicator": 0, "MessageExpiryInterval": 3600},
        ),
        ("mqbatch/dev-1/telemetry", b"\x05abc", [("batch-format", "v1"), ("batch-size", "2")], {}),  # malformed
        ("mqbatch/dev-2/telemetry", b"", [], {}),  # no batch at all
        ("mqbatch/dev-2/telemetry", b"\xff" * 70_000, [("batch-format", "v1"), ("batch-size", "1")], {}),  # too large
        ("mqbatch/dev-2/status", "{\"ok\": true}".encode(), [("é", "ü")], {"PayloadFormatIndicator": 1}),
    ]
    for topic, payload, props, extra in sent:
        publish(pub, topic, payload, props, **extra)
    pub.disconnect()
    wait_acked(broker, "rec-1", len(sent))
    time.sleep(1.2)  # one progress line
    assert rec.stop() == 0
    out = rec.output()
    assert "SIGTERM: closing the open landing file" in out and "stopped: 5 PUBLISHes landed, 5 acked" in out
    assert "msg/s, 5 PUBLISHes landed, 5 acked, 0 files rolled, 5 in the open segment" in out
    rows = landed_rows(tmp_path / "landing")
    assert len(rows) == 5
    for row, (topic, payload, props, extra) in zip(rows, sent):
        assert (row["topic"], row["payload"], row["qos"], row["retain"], row["dup"]) == (
            topic,
            payload,
            1,
            False,
            False,
        )
        assert [(p["key"], p["value"]) for p in row["user_properties"]] == props  # order and duplicates kept
        assert row["content_type"] == extra.get("ContentType")
        assert row["payload_format_indicator"] == extra.get("PayloadFormatIndicator")
        if "MessageExpiryInterval" in extra:  # the broker forwards the remaining lifetime
            assert 3590 <= row["message_expiry_interval"] <= 3600
        else:
            assert row["message_expiry_interval"] is None
        assert row["received_at"].tzinfo is not None and row["recorder"] == "rec-1"
    landing_dir = tmp_path / "landing"
    assert not list(landing_dir.glob(".*.tmp")) and not list((landing_dir / "_wal").glob("*.wal"))
    assert pq.read_schema(next(landing_dir.glob("landing-*.parquet"))).names[:9] == [
        "topic",
        "payload",
        "user_properties",
        "content_type",
        "payload_format_indicator",
        "message_expiry_interval",
        "qos",
        "retain",
        "received_at",
    ]


def sigkill_stream(broker, pki, rec, landing_dir, kill_at) -> tuple[int, list[int], list[bytes]]:
    """Publish a steady stream while `kill_at(rec)` waits for a moment to SIGKILL the recorder
    (twice, restarting it each time); then check that every PUBLISH the broker acknowledged
    was landed. Returns (published, published-before-each-kill, landed messages)."""
    pub = publisher(broker, pki)
    ids, acked = [], []
    stop_producing, done = threading.Event(), threading.Event()

    def produce():  # a steady stream (~1,000 PUBLISHes/s) until told to stop
        infos = []
        while not stop_producing.is_set():
            i = len(ids)
            payload = codec.encode_payload([f"msg-{i:05d}".encode()])
            p = Properties(PacketTypes.PUBLISH)
            p.UserProperty = [("batch-format", "v1"), ("batch-size", "1")]
            infos.append((i, pub.publish("mqbatch/dev-1/telemetry", payload, qos=1, properties=p)))
            ids.append(i)
            if i % 50 == 49:
                time.sleep(0.05)
        for i, info in infos:
            info.wait_for_publish(60)
            if info.is_published():
                acked.append(i)
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    kills = []
    for _ in range(2):
        kill_at(rec)
        kills.append(len(ids))
        rec.kill()  # SIGKILL: no clean-up at all
        time.sleep(0.3)
        rec.start()  # converts the WAL left behind, resumes the session
    time.sleep(0.5)
    stop_producing.set()  # so both kills happened mid-stream
    producer.join(120)
    n = len(ids)
    assert done.is_set() and len(acked) == n, f"broker acknowledged {len(acked)} of {n}"
    assert 0 < kills[0] < kills[1] < n, f"kills must happen while publishing: {kills} of {n}"
    want = {f"msg-{i:05d}".encode() for i in acked}

    def all_there(rows):
        return want <= {
            codec.decode([(p["key"], p["value"]) for p in r["user_properties"]], r["payload"]).messages[0] for r in rows
        }

    wait_landed(landing_dir, all_there, timeout=60)
    assert rec.stop() == 0
    rows = landed_rows(landing_dir)
    got = [codec.decode([(p["key"], p["value"]) for p in r["user_properties"]], r["payload"]).messages[0] for r in rows]
    missing = want - set(got)
    assert not missing, f"{len(missing)} acknowledged PUBLISHes lost, e.g. {sorted(missing)[:5]}"
    print(
        f"SIGKILL test: {n} published, killed at {kills}, {len(got)} landed, "
        f"{len(got) - len(set(got))} duplicates, 0 lost"
    )
    return n, kills, got


def test_sigkill_mid_stream_loses_no_acknowledged_publish(broker, pki, recorders, tmp_path):
    landing_dir = tmp_path / "landing"
    rec = recorders("rec-1", "--roll-seconds", "1").start()
    wal_dir = landing_dir / "_wal"

    def open_segment(rec):
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 0 for p in wal_dir.glob("*.wal")) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert list(wal_dir.glob("*.wal")), "the kill must hit an open (unrolled) segment"

    sigkill_stream(broker, pki, rec, landing_dir, open_segment)
    assert "recovered the previous run's open segment" in rec.output()


def test_sigkill_during_background_rolls_loses_nothing(broker, pki, recorders, tmp_path):
    """Segments roll every ~60 KB (a few times a second), in the background while the
    writer goes on landing and acknowledging: kills at random moments hit a roll in
    progress, a closed WAL waiting for its conversion, or a hidden .tmp Parquet file."""
    import random

    landing_dir = tmp_path / "landing"
    rec = recorders("rec-1", "--roll-bytes", "60000", "--roll-seconds", "1").start()
    rng = random.Random()

    def after_some_rolls(rec):
        deadline = time.monotonic() + 30
        start = len(list(landing_dir.glob("landing-*.parquet")))
        while len(list(landing_dir.glob("landing-*.parquet"))) < start + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.3))

    n, kills, got = sigkill_stream(broker, pki, rec, landing_dir, after_some_rolls)
    assert len(list(landing_dir.glob("landing-*.parquet"))) >= 4, "segments must have rolled during the stream"
    assert not list(landing_dir.glob(".*.tmp")), "a half-written Parquet file was left behind"


def test_recorder_offline_periods_miss_nothing_and_duplicate_nothing(broker, pki, recorders, tmp_path):
    """The experiment of the retained-message paper (Tables VII/VIII) with standard MQTT 5:
    a steady publisher, the subscriber offline for 1 s, 0.5 s and 0.2 s. Persistent session
    + ack-after-fsync + a clean stop that acknowledges exactly what it landed: every
    PUBLISH is landed exactly once."""
    rec = recorders("rec-1").start()
    pub = publisher(broker, pki)
    infos, stop_producing = [], threading.Event()

    def produce():  # ~200 PUBLISHes/s
        while not stop_producing.is_set():
            p = Properties(PacketTypes.PUBLISH)
            p.UserProperty = [("batch-format", "v1"), ("batch-size", "1")]
            infos.append(
                pub.publish(
                    "mqbatch/dev-1/telemetry", codec.encode_payload([b"%06d" % len(infos)]), qos=1, properties=p
                )
            )
            time.sleep(0.005)

    producer = threading.Thread(target=produce)
    producer.start()
    offline = []
    for gap in (1.0, 0.5, 0.2):
        time.sleep(0.5)
        assert rec.stop() == 0
        before = len(infos)
        time.sleep(gap)  # published meanwhile: queued by the broker
        offline.append(len(infos) - before)
        rec.start()
    time.sleep(0.5)
    stop_producing.set()
    producer.join(30)
    for info in infos:
        info.wait_for_publish(30)
    n = len(infos)
    assert all(info.is_published() for info in infos)
    assert all(k > 0 for k in offline), offline
    wait_acked(broker, "rec-1", n)
    assert rec.stop() == 0
    payloads = sorted(r["payload"] for r in landed_rows(tmp_path / "landing"))
    want = sorted(codec.encode_payload([b"%06d" % i]) for i in range(n))
    missed, duplicated = len(set(want) - set(payloads)), len(payloads) - len(set(payloads))
    print(
        f"offline periods 1/0.5/0.2 s: {n} published ({offline} while offline), "
        f"{missed} missed, {duplicated} duplicated"
    )
    assert (missed, duplicated) == (0, 0) and payloads == want


def test_shared_subscription_splits_the_load(broker, pki, recorders, tmp_path):
    a = recorders("rec-a").start()
    b = recorders("rec-b").start()
    pub = publisher(broker, pki)
    n = 400
    started = time.monotonic()
    infos = []
    for i in range(n):
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = [("batch-format", "v1"), ("batch-size", "1")]
        infos.append(
            pub.publish(f"mqbatch/dev-{i % 4}/telemetry", codec.encode_payload([b"%05d" % i]), qos=1, properties=p)
        )
    for info in infos:
        info.wait_for_publish(30)
    deadline = time.monotonic() + 30
    while sum(broker.logs().count(f"Received PUBACK from {c} ") for c in ("rec-a", "rec-b")) < n:
        assert time.monotonic() < deadline, "recorders did not acknowledge everything"
        time.sleep(0.05)
    assert a.stop() == 0 and b.stop() == 0
    rows = landed_rows(tmp_path / "landing")
    elapsed = time.monotonic() - started
    by_recorder = {r: sum(1 for x in rows if x["recorder"] == r) for r in ("rec-a", "rec-b")}
    assert sorted(x["payload"] for x in rows) == sorted(codec.encode_payload([b"%05d" % i]) for i in range(n))
    assert by_recorder["rec-a"] > 0 and by_recorder["rec-b"] > 0, by_recorder
    print(f"shared subscription: {n} PUBLISHes in {elapsed:.2f} s, split {by_recorder}")


def test_recorder_throughput(broker, pki, recorders, tmp_path):
    """Measured figure for docs/ingest.md: one recorder, 1 KiB batches, TLS, fsync per group."""
    rec = recorders("rec-1").start()
    pub = publisher(broker, pki)
    n = 5000
    body = codec.encode_payload([bytes(100)] * 10)
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("batch-format", "v1"), ("batch-size", "10")]
    infos = [pub.publish("mqbatch/dev-1/telemetry", body, qos=1, properties=p) for _ in range(n)]
    for info in infos:
        info.wait_for_publish(60)
    wait_acked(broker, "rec-1", n, timeout=60)
    assert rec.stop() == 0
    rows = landed_rows(tmp_path / "landing")
    assert len(rows) == n
    span = (rows[-1]["received_at"] - rows[0]["received_at"]).total_seconds()
    print(
        f"recorder throughput: {n} PUBLISHes of {len(body)} B landed in {span:.2f} s = {n / span:.0f} msg/s "
        f"(2-core VM, TLS, publisher in the same process as pytest)"
    )
    assert span > 0


_MPY_PUBLISHER = r"""
import sys, json
from mqb_transport import Transport
from mqb_client import Client
from mqb_codec import BatchEncoder
from mqb_record import RecordWriter, TickClock
host, port, ca, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
acks = []
c = Client(Transport(host, port, cafile=ca, server_hostname="localhost"), b"mpy-dev-1", username=b"publisher",
           password=password.encode(), session_expiry=0, receive_max=4, max_packet_size=512,
           on_ack=lambda pid, code, reason: acks.append(code))
c.connect()
topic = b"mqbatch/mpy-1/telemetry"
enc = BatchEncoder(bytearray(1024), headroom=96, max_count=20)
c.apply_budget(enc, topic, qos=1)
clock = TickClock()
clock.set_from_rtc(True)
w = RecordWriter(enc, clock, 5)
for batch in range(3):
    for i in range(7):
        assert w.sample((1, 2, 3), (2100 + i, 4500, 3300)) >= 0
    assert w.health((0x80, 0x82), (40000, 0)) >= 0
    assert c.publish_batch(enc, topic, qos=1) > 0
    assert c.flush(10000) == 0
    enc.reset()
c.disconnect()
print(json.dumps({"acks": acks}))
"""


def test_micropython_client_batches_are_landed(broker, pki, recorders, tmp_path):
    """The device client (firmware/mqb_client.py in the MicroPython Unix port) publishes
    real record batches over TLS; the recorder lands them and the host parsers agree."""
    rec = recorders("rec-1").start()
    script = tmp_path / "mpy_publisher.py"
    script.write_text(_MPY_PUBLISHER)
    proc = run_mpy(script, broker.host, str(broker.port), str(pki.ca_cert), USERS["publisher"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"acks": [0, 0, 0]}, proc.stdout
    wait_acked(broker, "rec-1", 3)
    assert rec.stop() == 0
    rows = landed_rows(tmp_path / "landing")
    assert len(rows) == 3
    seqs = []
    for row in rows:
        res = codec.decode([(p["key"], p["value"]) for p in row["user_properties"]], row["payload"])
        assert (res.status, res.count, row["topic"]) == ("ok", 8, "mqbatch/mpy-1/telemetry")
        now_ms = row["received_at"].timestamp() * 1000
        for m in res.messages:
            r = records.parse(m, received_at_ms=int(now_ms))
            assert r.boot == 5 and r.synced and abs(r.time_ms - now_ms) < 60_000
            seqs.append(r.seq)
    assert seqs == list(range(24))


# -- a recorded end-to-end run through the Spark job ------------------------------------


@pytest.mark.spark
def test_recorded_run_through_spark_job(broker, pki, recorders, tmp_path, spark):
    import telemetry_job as tj

    from mqbatch.spark.accounting import balance

    landing_dir = tmp_path / "landing"
    rec = recorders("rec-1", "--filter", "mqbatch/#").start()
    pub = publisher(broker, pki)
    now_ms = time.time_ns() // 1_000_000

    def batch(boot, seqs, dev_offset=0):
        return codec.encode_batch(
            [records.encode_binary("sample", boot, s, now_ms + s, [(1, 2000 + s), (2, 5000)]) for s in seqs]
        )

    batches = []
    props, payload = batch(1, range(0, 10))
    batches += [("mqbatch/dev-1/telemetry", props, payload)] * 2  # delivered twice
    batches.append(("mqbatch/dev-1/telemetry", *batch(1, range(12, 20))))  # 10, 11 lost
    batches.append(
        (
            "mqbatch/dev-1/telemetry",
            *codec.encode_batch([records.encode_binary("health", 1, 20, now_ms, [(0x80, 30000), (0x82, 2)])]),
        )
    )  # device dropped 2
    batches.append(("mqbatch/dev-2/telemetry", *batch(4, range(0, 5))))
    batches.append(("mqbatch/dev-2/telemetry", [("batch-format", "v2"), ("batch-size", "1")], b"\x01x"))
    batches.append(("mqbatch/dev-2/telemetry", [("batch-format", "v1"), ("batch-size", "3")], b"\x01x\x01y"))
    batches.append(
        (
            "mqbatch/dev-2/telemetry",
            *codec.encode_batch([b"\x07junk", records.encode_binary("sample", 4, 5, now_ms, [(1, 99999)])]),
        )
    )
    batches.append(("mqbatch/dev-2/status", *batch(4, [6])))
    for topic, props, payload in batches:
        publish(pub, topic, payload, props)
    wait_acked(broker, "rec-1", len(batches))
    assert rec.stop() == 0
    report = tj.run_batch(spark, str(landing_dir), str(tmp_path / "out"), tj.JobOptions(reorder_window=0))
    for dev in report["devices"].values():  # real clocks: latency exists, is small, not exact
        lat = dev.pop("latency_ms")
        assert lat["n"] == dev["unique"] and -5000 < lat["p50"] <= lat["p99"] < 60_000
    assert report["landed"] == len(batches) and report["batches"] == {"ok": 7, "discarded": 2}
    assert report["quarantine"]["by_reason"] == {
        "MALFORMED_BATCH_UNSUPPORTED_FORMAT": 1,
        "MALFORMED_BATCH_COUNT_MISMATCH": 1,
        "UNKNOWN_RECORD_VERSION": 1,
        "RECORD_VALUE_OUT_OF_RANGE": 1,
        "TOPIC_NOT_TELEMETRY": 1,
    }
    assert report["records"] == {"received": 34, "unique": 24, "duplicates": 10, "key_collisions": 0}
    recs = spark.read.parquet(str(tmp_path / "out" / "records")).orderBy("device", "boot", "seq").collect()
    assert [(r.device, r.boot, r.seq, r.kind) for r in recs] == (
        [("dev-1", 1, s, "sample") for s in list(range(10)) + list(range(12, 20))]
        + [("dev-1", 1, 20, "health")]
        + [("dev-2", 4, s, "sample") for s in range(5)]
    )
    quarantine = spark.read.parquet(str(tmp_path / "out" / "quarantine")).orderBy("offset", "sub_index").collect()
    assert [(q.topic, q.stage, q.reason, q.sub_index) for q in quarantine] == [
        ("mqbatch/dev-2/telemetry", "batch", "MALFORMED_BATCH_UNSUPPORTED_FORMAT", None),
        ("mqbatch/dev-2/telemetry", "batch", "MALFORMED_BATCH_COUNT_MISMATCH", None),
        ("mqbatch/dev-2/telemetry", "record", "UNKNOWN_RECORD_VERSION", 0),
        ("mqbatch/dev-2/telemetry", "record", "RECORD_VALUE_OUT_OF_RANGE", 1),
        ("mqbatch/dev-2/status", "topic", "TOPIC_NOT_TELEMETRY", None),
    ]
    raw = [p for _, _, p in batches]
    assert [bytes(q.payload) for q in quarantine] == [raw[5], raw[6], raw[7], raw[7], raw[8]]  # as published
    assert report["devices"] == {
        "dev-1": {
            "boots": 1,
            "received": 29,
            "unique": 19,
            "duplicates": 10,
            "missing": 2,
            "pending_gaps": 0,
            "out_of_order": 0,
            "dropped_on_device": 2,
            "key_collisions": 0,
            "quarantined": 0,
            # seqs 10 and 11 absent, and the health record counts 2 dropped: balanced
            "accounting": balance(19, 2, dropped=2, released=0),
        },
        "dev-2": {
            "boots": 1,
            "received": 5,
            "unique": 5,
            "duplicates": 0,
            "missing": 0,
            "pending_gaps": 0,
            "out_of_order": 0,
            "dropped_on_device": 0,
            "key_collisions": 0,
            "quarantined": 4,
            "accounting": balance(5, 0, dropped=0, released=0),
        },
    }
    assert all(d["accounting"]["balanced"] for d in report["devices"].values())


@pytest.mark.spark
def test_device_fleet_through_recorder_and_spark_job(mosquitto, pki, recorders, tmp_path, spark):
    """The whole path with the real device application: virtual devices (firmware/mqb_app.py in
    the MicroPython Unix port) -> Mosquitto (TLS, passwords, per-device ACL) -> `mqbatch ingest`
    -> landing zone -> the Spark job. Every record the devices stored is a row of records/."""
    import telemetry_job as tj

    from mqbatch.lab.devices import Fleet

    creds = {"dev-001": "pw-1", "dev-002": "pw-2"}
    broker = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={**creds, "recorder": USERS["recorder"]},
        acl="user recorder\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n",
        persistence=True,
        extra=["max_queued_messages 0"],
    )
    rec = recorders("rec-1", on=broker).start()
    cfg = {
        "sample_hz": 20,
        "run_for_s": 3,
        "drain_timeout_s": 30,
        "health_every_s": 1,
        "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 500},
        "backoff": {"initial_ms": 200, "max_ms": 2000},
    }
    with Fleet(
        tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, heapsize=None, config=cfg
    ) as fleet:
        fleet.start()
        codes = fleet.wait(90)
        assert codes == {"dev-001": 0, "dev-002": 0}, {d: fleet.console(d)[-2000:] for d in creds}
        stored, sums = fleet.stored(), fleet.summaries()
    # the devices got every PUBACK; wait until the recorder acknowledged all the broker sent it
    deadline, last = time.monotonic() + 30, None
    while True:
        logs = broker.logs()
        now = (logs.count("Sending PUBLISH to rec-1 "), logs.count("Received PUBACK from rec-1 "))
        if now[0] and now[0] == now[1] and now == last:
            break
        assert time.monotonic() < deadline, f"recorder did not catch up: {now}"
        last = now
        time.sleep(0.5)
    assert rec.stop() == 0
    report = tj.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), tj.JobOptions(reorder_window=0))
    recs = spark.read.parquet(str(tmp_path / "out" / "records")).select("device", "boot", "seq").collect()
    assert {(r.device, r.boot, r.seq) for r in recs} == stored and len(recs) == len(stored)
    assert report["quarantine"]["rows"] == 0 and report["batches"] == {"ok": now[0]}
    for dev in creds:
        d = report["devices"][dev]
        n = sum(1 for k in stored if k[0] == dev)
        assert (d["received"], d["unique"], d["duplicates"], d["missing"], d["pending_gaps"]) == (n, n, 0, 0, 0)
        assert d["dropped_on_device"] == sums[dev]["dropped_total"] == 0
        assert d["latency_ms"]["n"] == n and 0 <= d["latency_ms"]["p50"] <= d["latency_ms"]["p99"] < 10_000
    print(
        f"device fleet -> recorder -> Spark: {len(stored)} records in {now[0]} batches, "
        f"latency p50/p99 ms: "
        + ", ".join(
            f"{dev} {report['devices'][dev]['latency_ms']['p50']:.0f}/{report['devices'][dev]['latency_ms']['p99']:.0f}"
            for dev in creds
        )
    )
