"""End-to-end acknowledgements, host side (docs/e2e-ack.md): pure, no I/O.

A device sends each batch with a User Property ``batch-seq`` = ``B:F-L`` (boot,
first and last record sequence number). Once the recorder's write-ahead log
holding such a batch is fsync'd, it publishes to ``mqbatch/<device>/ack`` a
payload of ranges (u8 version 1, then N x (u32 boot, u32 first, u32 last),
little-endian, 1 <= N <= 64) saying which records are durable.

    acks = AckBatcher()
    for msg in committed_group:               # mqbatch.ingest.landing.Landed
        acks.add(msg.topic, msg.user_properties)
    for topic, payload in acks.take(free):    # ranges merged per device and boot;
        client.publish(topic, payload, qos=1, properties=...)   # Message Expiry 3600
                                              # free: Receive Maximum - acks in flight

The recorder trusts ``batch-seq`` only to address the ack: the ack goes to the
device named by the PUBLISH's own topic (bound to its account by the broker ACL).
"""

from __future__ import annotations

import re
import struct

from mqbatch.wire.records import RecordError, device_from_topic

PROPERTY = "batch-seq"
VERSION = 1
MAX_RANGES = 64  # per ack payload a device must accept: 13..769 bytes
# per ack PUBLISH the recorder sends: with a 64-character device id the whole PUBLISH
# (topic, packet id, Message Expiry, 1 + 12 x 32 bytes of payload) is 474 bytes, under the
# 512-byte Maximum Packet Size of mqbatch's firmware; a bigger ack would be dropped by the broker
SEND_RANGES = 32
MESSAGE_EXPIRY_S = 3600  # an ack not collected within an hour is dropped; the device resends
U32_MAX = 0xFFFFFFFF
RANGE = struct.Struct("<III")  # boot, first seq, last seq
_SEQ_RE = re.compile(r"(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,9})-(0|[1-9][0-9]{0,9})")

Range = tuple[int, int, int]  # (boot, first, last), first <= last


class AckError(ValueError):
    """An ack payload that breaks docs/e2e-ack.md section 2."""


def parse_batch_seq(value: str) -> Range | None:
    """`B:F-L` (ASCII decimal, no leading zeros, each 0..2^32-1, F <= L) -> (B, F, L); else None."""
    m = _SEQ_RE.fullmatch(value)
    if not m:
        return None
    boot, first, last = (int(g) for g in m.groups())
    if max(boot, first, last) > U32_MAX or first > last:
        return None
    return boot, first, last


def format_batch_seq(boot: int, first: int, last: int) -> str:
    """The property value a device sends (for test publishers and the scenario harness)."""
    if not (0 <= boot <= U32_MAX and 0 <= first <= last <= U32_MAX):
        raise ValueError(f"batch-seq {boot}:{first}-{last}: values must be 0..{U32_MAX} with first <= last")
    return f"{boot}:{first}-{last}"


def ack_topic(device: str) -> str:
    return f"mqbatch/{device}/ack"


def merge(ranges) -> list[Range]:
    """Ranges sorted by (boot, first), overlapping or adjacent ones of the same boot joined."""
    out: list[list[int]] = []
    for boot, first, last in sorted(ranges):
        if out and out[-1][0] == boot and first <= out[-1][2] + 1:
            out[-1][2] = max(out[-1][2], last)
        else:
            out.append([boot, first, last])
    return [(r[0], r[1], r[2]) for r in out]


def encode(ranges: list[Range]) -> list[bytes]:
    """Ack payloads for `ranges` (as given, not merged): one per SEND_RANGES ranges."""
    if not ranges:
        return []
    for boot, first, last in ranges:
        if not (0 <= boot <= U32_MAX and 0 <= first <= last <= U32_MAX):
            raise ValueError(f"range {boot}:{first}-{last}: values must be 0..{U32_MAX} with first <= last")
    return [
        bytes([VERSION]) + b"".join(RANGE.pack(*r) for r in ranges[i : i + SEND_RANGES])
        for i in range(0, len(ranges), SEND_RANGES)
    ]


def decode(payload: bytes) -> list[Range]:
    """The ranges of one ack payload; AckError says what breaks the contract."""
    payload = bytes(payload)
    if not payload or payload[0] != VERSION:
        raise AckError(f"ack version {payload[:1].hex() or 'missing'}, expected {VERSION:02x}")
    n, rest = divmod(len(payload) - 1, RANGE.size)
    if rest or not 1 <= n <= MAX_RANGES:
        raise AckError(f"ack payload of {len(payload)} bytes: must be 1 + 12 N with 1 <= N <= {MAX_RANGES}")
    ranges = [RANGE.unpack_from(payload, 1 + RANGE.size * i) for i in range(n)]
    for boot, first, last in ranges:
        if first > last:
            raise AckError(f"ack range {boot}:{first}-{last} has first > last")
    return ranges


class AckBatcher:
    """Collects the ranges of landed PUBLISHes and hands them out as ack PUBLISHes,
    merged per device and boot. Counters: acked (batches with a valid batch-seq),
    invalid (a batch-seq that is not B:F-L, more than one, or on a topic that is not
    mqbatch/<valid device id>/telemetry: landed, not acknowledged), without (no
    batch-seq at all: a device with e2e acks off, another publisher), dropped (ranges
    given up to stay within the bounds below: never acknowledged, so their device
    publishes them again).

    It is also what waits while the broker's Receive Maximum is used up (the recorder
    hands out only `take(n)` at a time): a device's ranges are merged at every hand-out,
    so the waiting costs one entry per device while a device's batches land in order, not
    one per batch. Ranges that cannot merge (another recorder of the share group landed the
    batches in between) are bounded: a device's list is merged once it holds
    MAX_PENDING_RANGES + SEND_RANGES and cut to its MAX_PENDING_RANGES highest (boot, first)
    ranges (the lowest dropped); at most MAX_PENDING_DEVICES devices and MAX_PENDING_TOTAL
    ranges in all wait (beyond them a new range is dropped). A range costs about 160 B of
    Python objects: MAX_PENDING_TOTAL bounds the whole at about 160 MB."""

    MAX_PENDING_RANGES = 2 * SEND_RANGES  # per device, after merging
    MAX_PENDING_DEVICES = 100_000  # devices with acks waiting (the broker's ACL bounds them to its accounts)
    MAX_PENDING_TOTAL = 1_000_000  # ranges waiting, all devices

    def __init__(self):
        self._ranges: dict[str, list[Range]] = {}
        self._total = 0  # ranges in self._ranges
        self.acked = self.invalid = self.without = self.dropped = 0

    def add(self, topic: str, user_properties) -> bool:
        """Note one landed PUBLISH; True if it will be acknowledged (unless dropped to stay bounded)."""
        values = [v for k, v in user_properties if k == PROPERTY]
        if not values:
            self.without += 1
            return False
        rng = parse_batch_seq(values[0]) if len(values) == 1 else None
        try:
            device = device_from_topic(topic)
        except RecordError:
            device = None
        if rng is None or device is None:
            self.invalid += 1
            return False
        self.acked += 1
        pending = self._ranges.get(device)
        if self._total >= self.MAX_PENDING_TOTAL or (pending is None and len(self._ranges) >= self.MAX_PENDING_DEVICES):
            self.dropped += 1
            return True
        if pending is None:
            pending = self._ranges[device] = []
        last = pending[-1] if pending else None
        if last is not None and last[0] == rng[0] and last[1] <= rng[1] and rng[1] <= last[2] + 1:
            pending[-1] = (last[0], last[1], max(last[2], rng[2]))  # the next batch in order: one entry
            return True
        pending.append(rng)
        self._total += 1
        if len(pending) >= self.MAX_PENDING_RANGES + SEND_RANGES:  # merge while waiting; keep the highest
            merged = merge(pending)
            kept = merged[-self.MAX_PENDING_RANGES :]
            self.dropped += len(merged) - len(kept)
            self._total += len(kept) - len(pending)
            self._ranges[device] = kept
        return True

    def __bool__(self) -> bool:
        return bool(self._ranges)

    @property
    def waiting(self) -> int:
        """Devices with ranges not handed out yet."""
        return len(self._ranges)

    def take(self, n: int) -> list[tuple[str, bytes]]:
        """At most n (ack topic, payload), ranges merged, devices in the order they
        started waiting; the rest keeps waiting."""
        out: list[tuple[str, bytes]] = []
        while len(out) < n and self._ranges:
            device = next(iter(self._ranges))
            pending = self._ranges.pop(device)
            ranges = merge(pending)
            k = min(len(ranges), (n - len(out)) * SEND_RANGES)
            out += [(ack_topic(device), p) for p in encode(ranges[:k])]
            self._total -= len(pending) - (len(ranges) - k)
            if k < len(ranges):
                self._ranges[device] = ranges[k:]
        return out

    def drain(self) -> list[tuple[str, bytes]]:
        """(ack topic, payload) for everything added since the last hand-out, ranges merged."""
        out: list[tuple[str, bytes]] = []
        while self._ranges:
            out += self.take(len(self._ranges))
        return out
