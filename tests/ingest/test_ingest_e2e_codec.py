"""docs/e2e-ack.md, host side, without a broker: the batch-seq property parser, the
range merger and the ack payload encoder/decoder (byte-exact against hand-made
payloads), and what the recorder's batcher acknowledges."""

from __future__ import annotations

import pytest

from mqbatch.ingest import e2eack
from mqbatch.ingest.e2eack import SEND_RANGES, AckBatcher, AckError, decode, encode, merge, parse_batch_seq


def test_ack_payload_is_byte_exact():
    # version 1, then per range u32 boot, u32 first, u32 last, little-endian
    assert encode([(1, 0, 99)]) == [bytes.fromhex("01010000000000000063000000")]
    assert encode([(7, 100, 199), (0xFFFFFFFF, 0x01020304, 0xFFFFFFFF)]) == [
        bytes.fromhex("010700000064000000c7000000ffffffff04030201ffffffff")
    ]
    assert encode([]) == []


def test_more_than_32_ranges_are_split_into_several_acks():
    ranges = [(1, 2 * i, 2 * i) for i in range(66)]  # not adjacent: nothing to merge
    payloads = encode(ranges)
    assert [len(p) for p in payloads] == [1 + 12 * 32, 1 + 12 * 32, 1 + 12 * 2]
    assert [r for p in payloads for r in decode(p)] == ranges
    assert len(encode(ranges[:32])) == 1


def test_the_largest_ack_publish_fits_the_firmwares_maximum_packet_size():
    """A 64-character device id, 32 ranges: the PUBLISH the broker forwards (QoS 1, topic,
    packet id, Message Expiry Interval, payload) must fit the firmware's 512-byte Maximum
    Packet Size, or the broker drops it and the device resends what it covered."""
    from mqbatch.wire import codec

    topic = e2eack.ack_topic("d" * 64).encode()
    payload = encode([(1, 2 * i, 2 * i) for i in range(100)])[0]
    props = bytes([0x02]) + e2eack.MESSAGE_EXPIRY_S.to_bytes(4, "big")
    body = (
        len(topic).to_bytes(2, "big") + topic + (1).to_bytes(2, "big") + codec.vbi_encode(len(props)) + props + payload
    )
    packet = bytes([0x32]) + codec.vbi_encode(len(body)) + body
    assert len(packet) == 474 <= 512


def test_merge_joins_overlapping_and_adjacent_ranges_per_boot():
    assert merge([(2, 10, 19), (1, 5, 9), (1, 0, 4), (2, 20, 20), (2, 25, 30), (1, 3, 6), (2, 26, 27)]) == [
        (1, 0, 9),
        (2, 10, 20),
        (2, 25, 30),
    ]
    assert merge([(1, 0, 9), (2, 10, 19)]) == [(1, 0, 9), (2, 10, 19)]  # another boot: never joined
    assert merge([(1, 0, 0xFFFFFFFF), (1, 5, 6)]) == [(1, 0, 0xFFFFFFFF)]
    assert merge([]) == []


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1:0-99", (1, 0, 99)),
        ("0:0-0", (0, 0, 0)),
        ("4294967295:4294967295-4294967295", (0xFFFFFFFF,) * 3),
        ("12:100-100", (12, 100, 100)),
        ("", None),
        ("1:0", None),
        ("1-0:99", None),
        ("01:0-99", None),
        ("1:00-99", None),
        ("1:0-099", None),
        (" 1:0-99", None),
        ("1:0-99 ", None),
        ("1:5-4", None),
        ("4294967296:0-1", None),
        ("1:0-4294967296", None),
        ("-1:0-1", None),
        ("+1:0-1", None),
        ("1:0-1\n", None),
        ("١:0-1", None),
        ("1:0-99999999999", None),
    ],
)
def test_batch_seq_values(value, expected):
    assert parse_batch_seq(value) == expected


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"", "version"),
        (b"\x02" + bytes(12), "version"),
        (b"\x01", r"1 \+ 12 N"),
        (b"\x01" + bytes(11), r"1 \+ 12 N"),
        (b"\x01" + bytes(13), r"1 \+ 12 N"),
        (b"\x01" + bytes(12 * 65), r"1 \+ 12 N"),
        (bytes.fromhex("01010000000500000004000000"), "first > last"),
    ],
)
def test_bad_ack_payloads_are_refused_with_the_reason(payload, why):
    with pytest.raises(AckError, match=why):
        decode(payload)


def test_encode_refuses_impossible_ranges():
    for bad in [(1, 5, 4), (-1, 0, 0), (1, 0, 1 << 32)]:
        with pytest.raises(ValueError):
            encode([bad])
    with pytest.raises(ValueError):
        e2eack.format_batch_seq(1, 2, 1)
    assert e2eack.format_batch_seq(3, 0, 99) == "3:0-99"


def test_batcher_acks_valid_batches_per_device_and_counts_the_rest():
    b = AckBatcher()
    seq = lambda v: [("batch-format", "v1"), ("batch-size", "1"), ("batch-seq", v)]
    assert b.add("mqbatch/dev-001/telemetry", seq("1:0-9"))
    assert b.add("mqbatch/dev-001/telemetry", seq("1:10-19"))
    assert b.add("mqbatch/dev-001/telemetry", seq("1:10-19"))  # a redelivery: acknowledged again
    assert b.add("mqbatch/dev-001/telemetry", seq("2:0-4"))
    assert b.add("mqbatch/dev-002/telemetry", seq("1:30-39"))
    assert not b.add("mqbatch/dev-002/telemetry", seq("1:9-3"))  # invalid value
    assert not b.add("mqbatch/dev-002/telemetry", seq("1:0-1") + [("batch-seq", "1:2-3")])  # two of them
    assert not b.add("mqbatch/dev 2/telemetry", seq("1:0-1"))  # not a valid device id
    assert not b.add("mqbatch/dev-002/status", seq("1:0-1"))  # not a telemetry topic
    assert not b.add("other/dev-002/telemetry", seq("1:0-1"))
    assert not b.add("mqbatch/dev-002/telemetry", [("batch-format", "v1")])  # e2e off on that device
    assert (b.acked, b.invalid, b.without) == (5, 5, 1)
    assert b
    out = b.drain()
    assert out == [
        ("mqbatch/dev-001/ack", bytes.fromhex("01010000000000000013000000020000000000000004000000")),
        ("mqbatch/dev-002/ack", bytes.fromhex("01010000001e00000027000000")),
    ]
    assert not b and b.drain() == []


def test_batcher_hands_out_at_most_n_merging_what_waits_and_stays_bounded(monkeypatch):
    seq = lambda first, last, boot=1: [("batch-seq", f"{boot}:{first}-{last}")]
    b = AckBatcher()
    for dev in ("dev-a", "dev-b", "dev-c"):
        for f in range(0, 50, 10):
            assert b.add(f"mqbatch/{dev}/telemetry", seq(f, f + 9))
    assert b.waiting == 3
    first = b.take(2)  # the window has room for 2: the devices that waited longest, merged
    assert [(t, decode(p)) for t, p in first] == [
        ("mqbatch/dev-a/ack", [(1, 0, 49)]),
        ("mqbatch/dev-b/ack", [(1, 0, 49)]),
    ]
    assert b.add("mqbatch/dev-a/telemetry", seq(50, 59))  # arrives while dev-c still waits
    assert b.add("mqbatch/dev-c/telemetry", seq(50, 59))
    assert [(t, decode(p)) for t, p in b.take(5)] == [
        ("mqbatch/dev-c/ack", [(1, 0, 59)]),  # its waiting ranges merged with the new one
        ("mqbatch/dev-a/ack", [(1, 50, 59)]),
    ]
    assert not b and b.take(5) == [] and b.take(0) == []
    # a device with more separate ranges than one payload holds: split over hand-outs
    for f in range(0, 40 * 3, 3):  # 40 ranges with gaps
        b.add("mqbatch/dev-a/telemetry", seq(f, f + 1))
    one = b.take(1)
    assert len(one) == 1 and len(decode(one[0][1])) == SEND_RANGES and b.waiting == 1
    assert [len(decode(p)) for _, p in b.drain()] == [40 - SEND_RANGES]
    # bounded: per device (merged at MAX + SEND_RANGES, the lowest beyond MAX dropped, counted),
    # in devices and in ranges in all
    monkeypatch.setattr(AckBatcher, "MAX_PENDING_RANGES", 4)
    monkeypatch.setattr(AckBatcher, "MAX_PENDING_DEVICES", 2)
    b = AckBatcher()
    n = 4 + SEND_RANGES  # separate ranges: merged when the last arrives, the 32 lowest dropped
    for i in range(n):
        assert b.add("mqbatch/dev-a/telemetry", seq(3 * i, 3 * i + 1))
    assert b.dropped == SEND_RANGES and b.acked == n
    assert b.add("mqbatch/dev-b/telemetry", seq(0, 0))
    assert b.add("mqbatch/dev-c/telemetry", seq(0, 0))  # a third device: dropped, counted
    assert b.dropped == SEND_RANGES + 1 and b.waiting == 2
    top = [(1, 3 * i, 3 * i + 1) for i in range(n - 4, n)]
    assert [(t, decode(p)) for t, p in b.drain()] == [("mqbatch/dev-a/ack", top), ("mqbatch/dev-b/ack", [(1, 0, 0)])]
    monkeypatch.setattr(AckBatcher, "MAX_PENDING_DEVICES", 100)
    monkeypatch.setattr(AckBatcher, "MAX_PENDING_TOTAL", 3)
    b = AckBatcher()
    for dev, f in (("a", 0), ("a", 5), ("b", 0), ("c", 0), ("a", 10)):  # 3 wait; the 4th and 5th dropped
        assert b.add(f"mqbatch/dev-{dev}/telemetry", seq(f, f))
    assert b.dropped == 2 and b.waiting == 2
    assert len(b.take(1)) == 1 and b.add("mqbatch/dev-c/telemetry", seq(0, 0))  # room again after a hand-out
    assert b.dropped == 2 and [t for t, _ in b.drain()] == ["mqbatch/dev-b/ack", "mqbatch/dev-c/ack"]


@pytest.mark.fast
def test_the_paho_internals_the_recorders_stop_relies_on_are_there():
    """The recorder's stop reaches into paho-mqtt 2.1 (no public call does it): it gives up
    unacknowledged acks (_out_messages under _out_message_mutex, _inflight_messages), wakes
    the loop (_thread_terminate, _sockpairW) and closes a stuck socket (_out_packet,
    _sock_close). A paho upgrade that renames one would slow or hang the stop silently:
    this fails instead."""
    import inspect

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    for name in ("_out_messages", "_out_message_mutex", "_inflight_messages", "_thread_terminate", "_out_packet"):
        assert hasattr(c, name), name
    assert "_sockpairW" in vars(c) and callable(c._sock_close)
    loop = inspect.getsource(mqtt.Client.loop_forever)
    assert "_thread_terminate" in loop and "_out_messages" in loop and "_out_packet" in loop


def test_batches_landing_in_order_wait_as_one_range_per_device(monkeypatch):
    """A device whose batches land in order costs one waiting range, whatever their number:
    with room for 3 ranges in all, 2 devices x 60 batches in order lose nothing (before,
    every batch took an entry until 96 waited, and the total bound dropped in-order acks)."""
    monkeypatch.setattr(AckBatcher, "MAX_PENDING_TOTAL", 3)
    b = AckBatcher()
    for f in range(0, 600, 10):
        for dev in ("a", "b"):
            assert b.add(f"mqbatch/dev-{dev}/telemetry", [("batch-seq", f"1:{f}-{f + 9}")])
    assert b.add("mqbatch/dev-a/telemetry", [("batch-seq", "1:100-109")])  # a redelivery: inside, no entry
    assert b.dropped == 0 and b.acked == 121
    assert [(t, decode(p)) for t, p in b.drain()] == [
        ("mqbatch/dev-a/ack", [(1, 0, 599)]),
        ("mqbatch/dev-b/ack", [(1, 0, 599)]),
    ]
