"""Issue 10, end to end: one misbehaving authenticated device must not be able to
lose, block or poison anyone else's telemetry. A real Mosquitto configured by
mqbatch.fleet.brokerconf (mqbatch.lab.stack), the real recorder (mqbatch.ingest.recorder.Recorder),
devices as paho-mqtt clients with their own accounts. Each test counts what the
honest device had acknowledged (PUBACK success) against what the recorder landed."""

from __future__ import annotations

import pytest

from mqbatch.ingest import landing
from mqbatch.lab.stack import RECORDER_CLIENT_ID
from mqbatch.scenarios.secmatrix import Probe, wait_until

pytestmark = pytest.mark.broker


def device(stack, dev, client_id=None, **kw) -> Probe:
    p = Probe(stack.broker.host, stack.broker.port, stack.ca_cert, client_id or dev, dev, stack.credentials[dev], **kw)
    assert p.connack == "0x00 Success", p.connack
    return p


def send(dev_probe: Probe, dev: str, n: int, tag: str) -> list[bytes]:
    """n QoS 1 PUBLISHes on the device's telemetry topic; returns the payloads acknowledged with success."""
    acked = []
    for i in range(n):
        payload = f"{tag}-{i}".encode()
        rc = dev_probe.publish(f"mqbatch/{dev}/telemetry", payload)
        if int(rc.split()[0], 16) < 0x80:
            acked.append(payload)
    return acked


def landed_payloads(landing_dir) -> list[bytes]:
    return [r["payload"] for r in landing.read_landing(landing_dir).to_pylist()]


def stop_and_count(rec, landing_dir, acked: list[bytes], what: str, timeout: float = 15) -> int:
    """Wait until the recorder acknowledged len(acked) (or timeout), stop it, print and
    return how many of the acknowledged payloads were landed."""
    wait_until(lambda: rec.recorder.acked >= len(acked), timeout)
    rec.output_before_stop = rec.out.getvalue()
    rec.stop()
    landed = len(set(landed_payloads(landing_dir)) & set(acked))
    print(f"{what}: {len(acked)} acknowledged, {landed} landed")
    return landed


def test_a_device_cannot_join_the_recorders_share_group(secure_stack, stack_recorder, tmp_path):
    # finding 1: with acl_file any account could SUBSCRIBE $share/mqbatch-recorders/...;
    # Mosquitto then round-robined telemetry to it, refused delivery and PUBACKed the sender
    stack = secure_stack(["dev-001", "dev-002"])
    rec = stack_recorder(stack, tmp_path / "landing")
    intruder = device(stack, "dev-002")
    answer = intruder.subscribe(stack.policy.share_subscription)
    honest = device(stack, "dev-001")
    acked = send(honest, "dev-001", 60, "share")
    landed = stop_and_count(rec, tmp_path / "landing", acked, f"share-group intrusion (SUBACK {answer})")
    assert len(acked) == 60 and landed == 60, "acknowledged PUBLISHes were lost"
    assert answer == "0x87 Not authorized"


def test_a_device_cannot_take_over_the_recorders_client_id(secure_stack, stack_recorder, tmp_path):
    # finding 2: any account could CONNECT as mqbatch-recorder-1, kick the recorder off and
    # take over its persistent session (where every queued message was then dropped)
    stack = secure_stack(["dev-001", "dev-002"])
    rec = stack_recorder(stack, tmp_path / "landing")
    intruder = Probe(
        stack.broker.host,
        stack.broker.port,
        stack.ca_cert,
        RECORDER_CLIENT_ID,
        "dev-002",
        stack.credentials["dev-002"],
        clean_start=False,
        session_expiry=3600,
    )
    honest = device(stack, "dev-001")
    acked = send(honest, "dev-001", 20, "takeover")
    intruder.close()
    landed = stop_and_count(rec, tmp_path / "landing", acked, f"client-id takeover (CONNACK {intruder.connack})")
    assert len(acked) == 20 and landed == 20, "acknowledged PUBLISHes were lost"
    assert intruder.connack == "0x87 Not authorized"
    assert "disconnected" not in rec.output_before_stop, rec.output_before_stop  # never kicked off
