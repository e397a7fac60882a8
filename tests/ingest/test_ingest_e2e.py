"""End-to-end acknowledgements (docs/e2e-ack.md), recorder side, against a real
Mosquitto with the policy of mqbatch.fleet.brokerconf (mqbatch.lab.stack): paho devices with
their own accounts publish batches with `batch-seq` and read their ack topic
(mqbatch.scenarios.e2edevice.AckingDevice); the real recorder lands and acknowledges."""

from __future__ import annotations

import re

import pytest

from mqbatch.ingest import landing
from mqbatch.lab.broker import write_private
from mqbatch.lab.recproc import RecorderProcess
from mqbatch.lab.stack import RECORDER_CLIENT_ID
from mqbatch.scenarios.e2edevice import AckingDevice
from mqbatch.scenarios.secmatrix import wait_until
from mqbatch.wire import codec, records

pytestmark = pytest.mark.broker


def device(stack, dev, **kw) -> AckingDevice:
    d = AckingDevice(stack.broker.host, stack.broker.port, stack.ca_cert, dev, stack.credentials[dev], **kw)
    assert d.connack == "0x00 Success", d.connack
    assert d.suback in (None, "0x01 Granted QoS 1"), d.suback
    return d


def landed_keys(landing_dir) -> dict[tuple[str, int, int], int]:
    """(device, boot, seq) -> how many times landed, decoded from the landing zone."""
    out: dict = {}
    for r in landing.read_landing(landing_dir).to_pylist():
        dev = records.device_from_topic(r["topic"])
        res = codec.decode([(p["key"], p["value"]) for p in r["user_properties"]], r["payload"])
        for m in res.messages:
            rec = records.parse(m)
            out[(dev, rec.boot, rec.seq)] = out.get((dev, rec.boot, rec.seq), 0) + 1
    return out


def keys(boot, first, last):
    return {(boot, s) for s in range(first, last + 1)}


def broker_puback_count(stack, client_id):
    return stack.broker.logs().count(f"Received PUBACK from {client_id} ")


@pytest.mark.fast
def test_device_gets_acks_covering_exactly_what_landed(secure_stack, stack_recorder, tmp_path):
    stack = secure_stack(["dev-001", "dev-002"])
    rec = stack_recorder(stack, tmp_path / "landing")
    d1, d2 = device(stack, "dev-001"), device(stack, "dev-002")
    sent1 = [(1, f, f + 9) for f in range(0, 200, 10)] + [(2, 0, 4), (2, 5, 5)]
    for b in sent1:
        assert d1.publish_batch(*b) == "0x00 Success"
    assert d2.publish_batch(7, 100, 149) == "0x00 Success"
    want1 = set().union(*(keys(*b) for b in sent1))
    assert d1.wait_acked(want1, 15), f"missing acks: {sorted(want1 - d1.acked)[:10]}"
    assert d2.wait_acked(keys(7, 100, 149), 15)
    rec.stop()
    d1.settle(0.5)
    landed = landed_keys(tmp_path / "landing")
    assert {(b, s) for (dev, b, s) in landed if dev == "dev-001"} == d1.acked == want1  # exactly what landed
    assert {(b, s) for (dev, b, s) in landed if dev == "dev-002"} == d2.acked
    for m in d1.ack_messages + d2.ack_messages:  # QoS 1, not retained, expiry 3600 s (minus transit)
        assert (m.qos, m.retain) == (1, False) and 3590 <= m.message_expiry <= 3600, m
    assert {m.topic for m in d1.ack_messages} == {"mqbatch/dev-001/ack"}
    assert {m.topic for m in d2.ack_messages} == {"mqbatch/dev-002/ack"}
    assert d1.bad_acks == d2.bad_acks == 0
    e2e = rec.recorder.e2e
    assert (e2e.acked, e2e.invalid, e2e.without) == (len(sent1) + 1, 0, 0)
    assert "e2e acks: 23 batches in" in rec.out.getvalue()
    print(
        f"e2e acks: {len(sent1) + 1} batches acknowledged in {rec.recorder.e2e_sent} ack PUBLISHes "
        f"(ranges per ack: {[len(m.ranges) for m in d1.ack_messages]})"
    )


def test_publish_without_or_with_invalid_batch_seq_is_landed_not_acked(secure_stack, stack_recorder, tmp_path):
    stack = secure_stack(["dev-001"])
    rec = stack_recorder(stack, tmp_path / "landing")
    d = device(stack, "dev-001")
    assert d.publish_batch(1, 0, 9, seq_value=None) == "0x00 Success"
    d.e2e = False
    assert d.publish_batch(1, 10, 19) == "0x00 Success"  # no batch-seq: e2e off
    assert d.publish_batch(1, 20, 29, seq_value="1:29-20") == "0x00 Success"  # invalid: F > L
    assert d.publish_batch(1, 30, 39, seq_value="01:30-39") == "0x00 Success"  # invalid: leading zero
    d.e2e = True
    assert d.publish_batch(1, 40, 49) == "0x00 Success"
    assert d.wait_acked(keys(1, 40, 49), 15)
    assert wait_until(lambda: rec.recorder.landed == 5, 10)
    rec.stop()
    d.settle(0.5)
    landed = landed_keys(tmp_path / "landing")
    assert {s for (_, _, s) in landed} == set(range(50))  # all five landed
    assert d.acked == keys(1, 0, 9) | keys(1, 40, 49)  # only the valid ones acknowledged
    e2e = rec.recorder.e2e
    assert (e2e.acked, e2e.invalid, e2e.without) == (2, 2, 1)
    out = rec.out.getvalue()
    assert out.count("invalid batch-seq property") == 1 and "'1:29-20'" in out, out


def test_no_e2e_ack_flag_turns_acks_off(secure_stack, stack_recorder, tmp_path):
    stack = secure_stack(["dev-001"])
    rec = stack_recorder(stack, tmp_path / "landing", e2e_ack=False)
    d = device(stack, "dev-001")
    assert d.publish_batch(1, 0, 9) == "0x00 Success"
    assert wait_until(lambda: rec.recorder.acked == 1, 10)
    assert d.settle(1.0) == 0 and not d.acked
    rec.stop()
    assert rec.recorder.e2e is None and "e2e acks off" in rec.out.getvalue()
    assert "'mqbatch/dev-001/ack'" not in stack.broker.logs()


def test_two_recorders_in_the_share_group_both_ack(secure_stack, stack_recorder, tmp_path):
    stack = secure_stack(["dev-001", "dev-002"], recorders=2)
    a = stack_recorder(stack, tmp_path / "landing")
    b = stack_recorder(stack, tmp_path / "landing", client_id="mqbatch-recorder-2")
    d = device(stack, "dev-001")
    sent = [(3, f, f + 4) for f in range(0, 200, 5)]
    for bt in sent:
        assert d.publish_batch(*bt) == "0x00 Success"
    want = keys(3, 0, 199)
    assert d.wait_acked(want, 20), f"missing: {sorted(want - d.acked)[:10]}"
    a.stop()
    b.stop()
    by = {r.recorder.cfg.client_id: r.recorder.e2e.acked for r in (a, b)}
    assert all(by.values()) and sum(by.values()) == len(sent), by  # each acknowledged what it landed
    logs = stack.broker.logs()
    for cid in by:
        assert f"Received PUBLISH from {cid} (d0, q1, r0, m" in logs and "'mqbatch/dev-001/ack'" in logs
    assert d.acked == want
    print(f"two recorders: {len(sent)} batches, acknowledged by {by}")


def test_recorder_killed_before_the_device_got_its_acks_acks_again_on_restart(secure_stack, tmp_path):
    """The batches are in the recorder's WAL (fsync'd, PUBACKed to the broker), but the
    device has none of their acks (it was not subscribed when they went out), and the
    recorder is SIGKILLed: on restart it replays its WAL and acknowledges them again.
    Nothing is redelivered by the broker (all PUBACKed), so these acks come from the WAL."""
    stack = secure_stack(["dev-001"])
    user, password = stack.recorder_login
    pw = write_private(tmp_path / "recorder.pw", password)  # 0600: a secret
    rec = RecorderProcess(
        tmp_path / "recorder.log",
        host=stack.broker.host,
        port=stack.broker.port,
        cafile=stack.ca_cert,
        landing=tmp_path / "landing",
        client_id=RECORDER_CLIENT_ID,
        username=user,
        password_file=pw,
    ).start()
    try:
        blind = device(stack, "dev-001", e2e=False)  # publishes batch-seq, not subscribed yet
        sent = [(4, f, f + 9) for f in range(0, 100, 10)]
        props = []
        for bt in sent:
            blind.e2e = True
            props.append(blind.publish_batch(*bt))
            blind.e2e = False
        assert props == ["0x00 Success"] * len(sent)
        assert wait_until(lambda: broker_puback_count(stack, RECORDER_CLIENT_ID) >= len(sent), 15)
        assert wait_until(lambda: stack.broker.logs().count("'mqbatch/dev-001/ack'") >= 1, 10)  # acks went nowhere
        rec.kill()
        assert list((tmp_path / "landing" / "_wal").glob("*.wal")), "the kill must leave the WAL behind"
        blind.close()
        d = device(stack, "dev-001")
        assert d.settle(0.5) == 0  # nothing retained or queued for it
        offset = len(rec.output())
        rec.start()
        want = keys(4, 0, 99)
        assert d.wait_acked(want, 15), f"acks missing after restart: {sorted(want - d.acked)[:10]}\n{rec.output()}"
        assert rec.stop() == 0
        out = rec.output(offset)
        assert "10 replayed batches will be acknowledged end to end again" in out, out
        assert "stopped: 0 PUBLISHes landed" in out, out  # no redelivery: the acks came from the WAL
        assert sum(landed_keys(tmp_path / "landing").values()) == 100
    finally:
        rec.close()


class HandedToPaho:
    """Watches a paho client from outside: PUBLISHes handed to it (publish()) that its
    on_publish has not yet reported acknowledged; the most at any time."""

    def __init__(self, client):
        import threading

        self.now = self.most = self.calls = 0
        self._lock = threading.Lock()
        publish, on_publish = client.publish, client.on_publish

        def counted_publish(*a, **kw):
            with self._lock:
                self.calls += 1
                self.now += 1
                self.most = max(self.most, self.now)
            return publish(*a, **kw)

        def counted_on_publish(*a):
            with self._lock:
                self.now -= 1
            if on_publish is not None:
                on_publish(*a)

        client.publish, client.on_publish = counted_publish, counted_on_publish


def test_acks_respect_the_brokers_receive_maximum_and_merge_while_waiting(secure_stack, stack_recorder, tmp_path):
    """The broker grants the recorder a Receive Maximum of 2 (max_inflight_messages 2):
    the recorder may have at most 2 ack PUBLISHes unacknowledged at any time (MQTT 5
    3.3.4), and the acks that wait meanwhile are merged per device, not queued one per
    batch. 12 devices publish 10 batches each at once; every record must be acked, the
    recorder never disconnected, and paho never holds more than 2 of its acks (watched from
    outside). Merging while waiting: tests/ingest/test_ingest_e2e_codec.py."""
    import threading

    devs = [f"dev-{i:03d}" for i in range(12)]
    stack = secure_stack(devs, broker_options={"max_inflight_messages": 2})
    rec = stack_recorder(stack, tmp_path / "landing")
    held = HandedToPaho(rec.recorder.client)
    ds = [device(stack, d) for d in devs]
    sent = [(1, f, f + 4) for f in range(0, 50, 5)]
    codes: list[str] = []

    def publish_all(d):
        codes.extend(d.publish_batch(*b) for b in sent)

    threads = [threading.Thread(target=publish_all, args=(d,)) for d in ds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == ["0x00 Success"] * len(devs) * len(sent)
    want = keys(1, 0, 49)
    for d in ds:
        assert d.wait_acked(want, 20), f"{d.device_id}: missing acks {sorted(want - d.acked)[:10]}"
    rec.stop()
    logs = stack.broker.logs()
    out = rec.out.getvalue()
    assert out.count("connected to ") == 1, out  # never disconnected meanwhile
    assert "acks not sent" not in out and "not confirmed" not in out and "refused by" not in out, out
    refused = [ln for ln in logs.splitlines() if f"Sending PUBACK to {RECORDER_CLIENT_ID}" in ln and "rc0)" not in ln]
    assert not refused, f"the broker refused {len(refused)} ack PUBLISHes: {refused[:3]}"
    assert held.calls == rec.recorder.e2e_sent and held.now == 0, (held.calls, held.now)
    assert held.most <= 2, f"{held.most} ack PUBLISHes handed to paho at once, over the Receive Maximum 2"
    n_acks = sum(len(d.ack_messages) for d in ds)  # merging while waiting: test_ingest_e2e_codec.py
    print(f"receive maximum 2: {len(devs) * len(sent)} batches acknowledged in {n_acks} ack PUBLISHes")


def test_a_stop_while_the_broker_answers_nothing_is_bounded_and_says_which_acks_are_left(
    secure_stack, stack_recorder, tmp_path
):
    """paho's loop ends only when every QoS 1 PUBLISH it holds is acknowledged: a recorder
    stopped while the broker hangs with e2e acks unacknowledged waited for them for ever.
    Now it gives them up after its grace (counted in the stop line; their devices resend)."""
    import time

    stack = secure_stack(["dev-001"], broker_options={"max_inflight_messages": 1})
    rec = stack_recorder(stack, tmp_path / "landing")
    d = device(stack, "dev-001")
    frozen = False
    try:
        for attempt in range(20):  # freeze the broker while the recorder has an ack unacknowledged
            assert d.publish_batch(2, 10 * attempt, 10 * attempt + 9) == "0x00 Success"
            if wait_until(lambda: rec.recorder._e2e_mids, 2, step=0.0005):
                stack.broker.suspend()
                frozen = True
                time.sleep(0.3)
                if rec.recorder._e2e_mids:
                    break
                stack.broker.resume()
                frozen = False
        assert frozen, "no ack was ever unacknowledged when the broker froze (20 tries)"
        t0 = time.monotonic()
        rec.stop(timeout=40)
        took = time.monotonic() - t0
    finally:
        if frozen:
            stack.broker.resume()
    out = rec.out.getvalue()
    assert took < 20, f"the stop took {took:.1f} s"
    assert re.search(r"[1-9]\d* ack PUBLISHes not confirmed", out), out
    print(f"stop with the broker frozen: {took:.1f} s; {out.strip().splitlines()[-1][-160:]}")
