"""Issue 23.5 (E): a per-device byte quota in the recorder (one account pushed 1.18 GB
in 20 s into the landing zone; Mosquitto 2.0 has no per-client quota). A device over
its quota has its PUBLISHes acknowledged but not landed, each one counted; another
device within its quota loses nothing; received = landed + refused exactly."""

from __future__ import annotations

import time

import pytest
from test_ingest import ACL, USERS, publisher

from mqbatch.ingest import landing
from mqbatch.ingest.quota import DeviceQuota, device_of
from mqbatch.ingest.recorder import RecorderConfig
from mqbatch_testing.broker import RecorderThread

pytestmark = pytest.mark.broker

RATE, BURST, SIZE = 20_000, 80_000, 2_000


def test_bucket_arithmetic():
    q = DeviceQuota(rate=100, burst=300)
    assert [q.admit("a", 100, 0.0) for _ in range(4)] == [True, True, True, False]
    assert q.admit("b", 300, 0.0)  # buckets are per device
    assert not q.admit("a", 100, 0.5) and q.admit("a", 100, 1.5)  # refills at `rate` per second
    assert (q.refused, q.refused_bytes, dict(q.by_device)) == (2, 200, {"a": 2})
    assert device_of("mqbatch/dev-1/telemetry") == "dev-1" and device_of("other/x") == "?"
    with pytest.raises(ValueError):
        DeviceQuota(rate=0, burst=1)


def test_a_flooding_device_is_cut_to_its_quota_and_counted(mosquitto, pki, tmp_path):
    broker = mosquitto(tls=True, allow_anonymous=False, users=USERS, acl=ACL, persistence=True)
    cfg = RecorderConfig(
        host=broker.host,
        port=broker.port,
        landing=str(tmp_path / "landing"),
        client_id="rec-1",
        cafile=str(pki.ca_cert),
        username="recorder",
        password=USERS["recorder"],
        device_quota_bytes_per_s=RATE,
        device_quota_burst_bytes=BURST,
        max_packet_size=BURST,
        e2e_ack=False,
    )
    rec = RecorderThread(cfg).start()
    pub = publisher(broker, pki)
    t0 = time.monotonic()
    flood = [b"F%05d" % i + b"f" * (SIZE - 6) for i in range(300)]  # 600 KB as fast as it goes
    for p in flood:
        pub.publish("mqbatch/dev-flood/telemetry", p, qos=1)
    calm = []
    for i in range(10):  # 20 KB in ~2 s: within its quota
        calm.append(b"C%05d" % i + b"c" * (SIZE - 6))
        pub.publish("mqbatch/dev-calm/telemetry", calm[-1], qos=1).wait_for_publish(10)
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while rec.recorder.received < len(flood) + len(calm) and time.monotonic() < deadline:
        time.sleep(0.1)
    elapsed = time.monotonic() - t0
    pub.disconnect()
    pub.loop_stop()
    assert rec.stop() == 0
    out = rec.out.getvalue()
    got = landing.read_landing(tmp_path / "landing").column("payload").to_pylist()
    q = rec.recorder.quota
    landed_flood = [p for p in got if p.startswith(b"F")]
    print(f"flood: {len(landed_flood)} of {len(flood)} landed, {q.refused} refused in {elapsed:.1f} s")
    assert sorted(p for p in got if p.startswith(b"C")) == calm  # the other device lost nothing
    assert len(landed_flood) * SIZE <= BURST + RATE * elapsed + SIZE  # cut to its quota
    assert q.by_device == {"dev-flood": len(flood) - len(landed_flood)} and q.refused > 0  # each refusal counted
    assert rec.recorder.received == rec.recorder.landed + q.refused == len(flood) + len(calm)
    assert out.count("device 'dev-flood' is over its quota") >= 1 and "refused, from 1 devices" in out
