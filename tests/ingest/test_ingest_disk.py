"""Issue 22.3 (C): a recorder that waits instead of dying. The landing directory is a
small tmpfs mounted by the test and filled up (ENOSPC) while a paho publisher keeps
sending: the recorder stops acknowledging (and so the broker stops sending and keeps
queuing), logs once, retries with back-off and resumes by itself when space comes
back; nothing it could not fsync is ever acknowledged; nothing is lost. A restart
while the disk is still full waits the same way (never exit status 2, which means
bad configuration). Needs root (mount); skipped with the reason otherwise."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pyarrow.parquet as pq
import pytest
from test_ingest import ACL, USERS, publisher

from mqbatch.ingest import landing
from mqbatch.ingest.recorder import RecorderConfig
from mqbatch.lab import recproc
from mqbatch_testing.broker import RecorderThread

pytestmark = pytest.mark.broker

PAYLOAD = 1000


def payload(i: int) -> bytes:
    return b"%06d" % i + b"x" * (PAYLOAD - 6)


@pytest.fixture
def disk(tmp_path):
    """A 6 MiB tmpfs of our own at tmp_path/disk (unmounted after the test)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a full disk for real)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt) -> os.PathLike:
    """Take every free byte of the tmpfs (until ENOSPC); returns the filler's path."""
    path = mnt / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    block = b"\0" * 65536
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError:
                block = block[: len(block) // 2]
                if len(block) < 512:
                    break
    finally:
        os.close(fd)
    return path


def durable_rows(landing_dir) -> int:
    """Rows that would survive a crash now: Parquet files plus complete WAL frames."""
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in landing_dir.glob("landing-*.parquet"))
    for wal in (landing_dir / landing.WAL_DIR).glob("*.wal"):
        n += len(landing.read_wal(wal)[0])
    return n


def pubacks(broker, client_id="rec-1") -> int:
    return len(re.findall(rf"Received PUBACK from {client_id} ", broker.logs()))


def publish(pub, first: int, n: int) -> list[bytes]:
    sent = [payload(i) for i in range(first, first + n)]
    for p in sent:
        pub.publish("mqbatch/dev-001/telemetry", p, qos=1).wait_for_publish(10)
    return sent


def wait(cond, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


@pytest.fixture
def broker(mosquitto):
    return mosquitto(
        tls=True, allow_anonymous=False, users=USERS, acl=ACL, persistence=True, extra=["max_queued_messages 0"]
    )


def recorder_cfg(broker, pki, landing_dir) -> RecorderConfig:
    return RecorderConfig(
        host=broker.host,
        port=broker.port,
        landing=str(landing_dir),
        client_id="rec-1",
        cafile=str(pki.ca_cert),
        username="recorder",
        password=USERS["recorder"],
        roll_bytes=256 << 10,  # rolls (Parquet conversions) meet the full disk too
        progress_seconds=1,
        e2e_ack=False,
    )


def land_then_fill(broker, pki, disk, before: int, during: int):
    """A recorder lands `before` PUBLISHes, the disk fills up, `during` more are published
    and the recorder says it is blocked. Returns (recorder, publisher, sent, filler)."""
    rec = RecorderThread(recorder_cfg(broker, pki, disk / "landing")).start()
    pub = publisher(broker, pki)
    sent = publish(pub, 0, before)
    wait(lambda: rec.recorder.acked == before, 20, rec.out.getvalue)
    filler = fill(disk)
    sent += publish(pub, before, during)  # the broker takes them all; the recorder can land none
    wait(lambda: "landing blocked: ENOSPC" in rec.out.getvalue(), 20, rec.out.getvalue)
    return rec, pub, sent, filler


def test_full_disk_blocks_landing_and_acks_then_resumes_with_nothing_lost(broker, pki, disk):
    land = disk / "landing"
    rec, pub, sent, filler = land_then_fill(broker, pki, disk, 200, 400)
    time.sleep(2.0)
    acks_blocked = pubacks(broker)
    checks = []
    for _ in range(4):  # while blocked: every PUBACK the broker got is durable, and none comes
        acked = pubacks(broker)
        checks.append((acked, durable_rows(land)))
        time.sleep(1.0)
    assert all(a <= d for a, d in checks), checks
    assert pubacks(broker) == acks_blocked, "acknowledged while the disk was full"
    assert rec.recorder.received - rec.recorder.landed <= 100  # stopped taking from the broker (receive maximum)
    os.unlink(filler)
    wait(lambda: "landing resumed" in rec.out.getvalue(), 60, rec.out.getvalue)
    sent += publish(pub, 600, 50)
    wait(lambda: rec.recorder.acked >= 650, 60, rec.out.getvalue)
    pub.disconnect()
    pub.loop_stop()
    assert rec.stop() == 0, rec.out.getvalue()
    out = rec.out.getvalue()
    assert out.count("landing blocked: ENOSPC") == 1, out  # one line per state change, not per retry
    got = landing.read_landing(land).column("payload").to_pylist()
    assert set(got) == set(sent), f"lost {len(set(sent) - set(got))} of {len(sent)}"
    assert pubacks(broker) <= len(got)


def test_restart_while_the_disk_is_full_waits_instead_of_exiting(broker, pki, disk, tmp_path):
    land = disk / "landing"
    rec, pub, sent, filler = land_then_fill(broker, pki, disk, 100, 100)
    assert rec.stop() in (0, 1), rec.out.getvalue()  # stopped while blocked: nothing unlanded acknowledged
    assert pubacks(broker) <= durable_rows(land)
    pw = tmp_path / "recorder.pw"  # log and password file: not on the full disk
    pw.write_text(USERS["recorder"])
    again = recproc.RecorderProcess(
        tmp_path / "again.log",
        host=broker.host,
        port=broker.port,
        cafile=pki.ca_cert,
        landing=land,
        client_id="rec-1",
        username="recorder",
        password_file=pw,
        extra=("--no-e2e-ack",),
    )
    try:
        again.start(60)  # connects and subscribes although it cannot land
        wait(lambda: "landing blocked" in again.output() or "cannot convert" in again.output(), 30, again.output)
        time.sleep(2.0)
        assert again.running, again.output()
        os.unlink(filler)
        wait(lambda: "landing resumed" in again.output(), 60, again.output)
        sent += publish(pub, 200, 20)
        wait(lambda: durable_rows(land) >= len(set(sent)), 60, again.output)
        pub.disconnect()
        pub.loop_stop()
        assert again.stop() == 0, again.output()
    finally:
        again.close()
    got = landing.read_landing(land).column("payload").to_pylist()
    assert set(got) == set(sent), f"lost {len(set(sent) - set(got))} of {len(sent)}:\n{again.output()}"
