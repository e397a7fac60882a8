"""Lightweight simulated devices for `mqbatch bench fleet`: many per process (asyncio).

Each device is what the firmware does on the wire, written on the host: it samples one
binary v1 record (mqbatch.wire.records, 4 channels, 38 B) every 1/rate s, appends it to
its outbox, and when `batch` records are pending builds one batch-format v1 PUBLISH
(mqbatch.wire.codec) with the ``batch-seq`` (end-to-end ack) and ``batch-hmac``
properties, QoS 1, over its own TLS connection to Mosquitto (its own account: client id
= username = device id). It subscribes to ``mqbatch/<id>/ack`` and drops a batch from
its outbox only when an end-to-end ack covers it (mqbatch.ingest.e2eack); a batch not
acked within `ack_timeout` s is published again, and all of them after a reconnect.

Lost connections (`cut_after`, `bench fleet --cut-after`): after that fraction of its
new PUBLISHes a device aborts its connection (no DISCONNECT, as a board whose Wi-Fi drops)
at a random moment within `cut_within_s` of it, reconnects after its back-off and publishes its
whole outbox again. A batch the recorder landed whose end-to-end ack the cut lost is
then landed twice: the resends the streaming job must drop from records/.

Accounting per device: stored (records appended to the outbox), published (records in
batches sent at least once), republished (records sent again), acked (records an
end-to-end ack covered), outbox (records not yet acked), dropped (outbox full: the
oldest batch dropped, counted, never silent). Each record's sampling time (ms since the
epoch, the value written into the record) is kept by seq for the time-to-table join.

The MQTT 5 packets are built here (CONNECT, SUBSCRIBE, PUBLISH, PUBACK, PINGREQ,
DISCONNECT: a few lines each) so a device costs one socket and a few KB, not a paho
client and its thread: thousands fit in one process.
"""

from __future__ import annotations

import array
import asyncio
import collections
import dataclasses
import heapq
import random
import ssl
import struct
import time

from mqbatch.ingest import e2eack
from mqbatch.wire import codec, integrity
from mqbatch.wire.records import encode_binary

KEEPALIVE_S = 60
BOOT = 1


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + codec.vbi_encode(len(body)) + body


def connect_packet(client_id: str, username: str, password: str) -> bytes:
    # clean start, no session (a resend after reconnect covers what was in flight)
    props = b""
    var = _str("MQTT") + bytes([5, 0x80 | 0x40 | 0x02]) + struct.pack(">H", KEEPALIVE_S)
    var += codec.vbi_encode(len(props)) + props
    return _packet(0x10, var + _str(client_id) + _str(username) + _str(password))


def subscribe_packet(pid: int, topic: str) -> bytes:
    return _packet(0x82, struct.pack(">H", pid) + b"\x00" + _str(topic) + b"\x01")


def publish_packet(topic: str, pid: int, user_properties: list[tuple[str, str]], payload: bytes) -> bytes:
    props = b"".join(b"\x26" + _str(k) + _str(v) for k, v in user_properties)
    return _packet(0x32, _str(topic) + struct.pack(">H", pid) + codec.vbi_encode(len(props)) + props + payload)


def puback_packet(pid: int) -> bytes:
    return b"\x40\x02" + struct.pack(">H", pid)


PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


def _vbi(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(4):
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value, pos + i + 1
    raise ValueError("bad variable byte integer")


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    mult, length = 1, 0
    for _ in range(4):
        b = (await reader.readexactly(1))[0]
        length += (b & 0x7F) * mult
        mult *= 128
        if not b & 0x80:
            break
    return first, await reader.readexactly(length)


def publish_payload(first: int, body: bytes) -> tuple[str, int | None, bytes]:
    """(topic, packet id or None, payload) of a received PUBLISH body."""
    n = struct.unpack_from(">H", body)[0]
    topic = body[2 : 2 + n].decode()
    pos = 2 + n
    pid = None
    if (first >> 1) & 3:
        pid = struct.unpack_from(">H", body, pos)[0]
        pos += 2
    plen, pos = _vbi(body, pos)
    return topic, pid, body[pos + plen :]


@dataclasses.dataclass
class SimOptions:
    host: str
    port: int
    cafile: str
    rate: float = 1.0  # records per second per device
    batch: int = 10  # records per PUBLISH
    ack_timeout: float = 30.0  # s without an end-to-end ack before a batch is published again
    ramp_s: float = 10.0  # connections spread over this long
    max_outbox: int = 100_000  # records; beyond it the oldest batch is dropped (counted)
    e2e: bool = True  # False: no batch-seq, a batch leaves the outbox on its PUBACK (the cost baseline)
    cut_after: float = 0.0  # fraction of PUBLISHes after which the connection is lost (module docstring)
    cut_within_s: float = 1.0  # ... that long after the PUBLISH at most (uniform)


COUNTERS = (
    "stored",
    "published",
    "republished",
    "acked",
    "dropped",
    "batches",
    "pubacks",
    "puback_errors",
    "connects",
    "connected",
    "disconnects",
    "connect_errors",
    "ack_msgs",
    "cuts",
)


class Device:
    def __init__(self, dev: str, password: str, key: bytes, opts: SimOptions, ctx: ssl.SSLContext, stats: dict):
        self.dev, self.password, self.key, self.o, self.ctx = dev, password, key, opts, ctx
        self.topic = f"mqbatch/{dev}/telemetry"
        self.stats = stats
        self.seq = 0
        self.pending: list[bytes] = []
        self.outbox: collections.OrderedDict[int, list] = collections.OrderedDict()  # first -> [last, pkt args, sent]
        self.outbox_records = 0
        self.sample_ms = array.array("q")
        self.inflight: dict[int, int] = {}  # packet id -> first seq of the batch it carries
        self.writer: asyncio.StreamWriter | None = None
        self.pid = 0
        self.connected = asyncio.Event()
        self.last_tx = 0.0
        self.rng = random.Random(dev)

    def _next_pid(self) -> int:
        self.pid = self.pid % 65535 + 1
        return self.pid

    def sample(self, now_ms: int) -> None:
        r = self.rng
        rec = encode_binary(
            "sample",
            BOOT,
            self.seq,
            now_ms,
            ((1, r.randint(1500, 2500)), (2, r.randint(3000, 6000)), (3, 3300), (4, -r.randint(40, 80))),
        )
        self.sample_ms.append(now_ms)
        self.seq += 1
        self.pending.append(rec)
        self.stats["stored"] += 1
        if len(self.pending) >= self.o.batch:
            self.close_batch()

    def close_batch(self) -> None:
        if not self.pending:
            return
        last = self.seq - 1
        first = last - len(self.pending) + 1
        props, payload = codec.encode_batch(self.pending)
        if self.o.e2e:
            props.append((e2eack.PROPERTY, e2eack.format_batch_seq(BOOT, first, last)))
        props.append(integrity.sign(self.key, self.topic, props, payload))
        self.pending = []
        self.stats["batches"] += 1
        self.outbox[first] = [last, props, payload, None]
        self.outbox_records += last - first + 1
        while self.outbox_records > self.o.max_outbox:
            f, (lst, *_rest) = self.outbox.popitem(last=False)
            self.outbox_records -= lst - f + 1
            self.stats["dropped"] += lst - f + 1
        self.send(first)

    def send(self, first: int) -> None:
        entry = self.outbox.get(first)
        if entry is None or self.writer is None or not self.connected.is_set():
            return
        last, props, payload, sent = entry
        pid = self._next_pid()
        self.inflight[pid] = first
        self.writer.write(publish_packet(self.topic, pid, props, payload))
        self.last_tx = time.monotonic()
        n = last - first + 1
        self.stats["republished" if sent is not None else "published"] += n
        entry[3] = time.monotonic()
        # only after a new batch: cuts after the resends of a reconnect would cut every one
        if sent is None and self.o.cut_after and self.rng.random() < self.o.cut_after:
            asyncio.get_running_loop().call_later(self.rng.random() * self.o.cut_within_s, self._cut, self.writer)

    def _cut(self, writer: asyncio.StreamWriter) -> None:
        """Lose the connection `writer` (if it is still the current one): no DISCONNECT, the
        socket closed at once; nothing more is sent on it, run_connection's read fails and
        it reconnects."""
        if writer is self.writer:
            self.stats["cuts"] += 1
            self.writer = None
            self.connected.clear()
            writer.transport.abort()

    def resend_due(self, now: float) -> None:
        for first, entry in list(self.outbox.items()):
            if entry[3] is not None and now - entry[3] > self.o.ack_timeout:
                self.send(first)

    def on_ack(self, payload: bytes) -> None:
        self.stats["ack_msgs"] += 1
        for boot, first, last in e2eack.decode(payload):
            if boot != BOOT:
                continue
            for f in [f for f in self.outbox if first <= f and self.outbox[f][0] <= last]:
                lst = self.outbox.pop(f)[0]
                self.outbox_records -= lst - f + 1
                self.stats["acked"] += lst - f + 1

    def on_puback(self, pid: int) -> None:
        first = self.inflight.pop(pid, None)
        if not self.o.e2e and first in self.outbox:  # without e2e acks the broker's PUBACK ends a batch
            lst = self.outbox.pop(first)[0]
            self.outbox_records -= lst - first + 1
            self.stats["acked"] += lst - first + 1

    async def run_connection(self, stop_all: asyncio.Event) -> None:
        """Connect, subscribe, (re)send the outbox, read until the connection ends; reconnect."""
        backoff = 1.0
        while not stop_all.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    self.o.host, self.o.port, ssl=self.ctx, server_hostname="localhost"
                )
            except OSError as e:
                self.stats["connect_errors"] += 1
                self.stats["last_error"] = f"{self.dev}: connect: {e}"
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 30)
                continue
            try:
                writer.write(connect_packet(self.dev, self.dev, self.password))
                first, body = await read_packet(reader)
                if first >> 4 != 2 or body[1] != 0:
                    raise ConnectionError(f"CONNACK {body.hex()}")
                writer.write(subscribe_packet(self._next_pid(), e2eack.ack_topic(self.dev)))
                first, body = await read_packet(reader)
                if first >> 4 != 9 or body[-1] >= 0x80:
                    raise ConnectionError(f"SUBACK {body.hex()}")
                self.writer = writer
                self.connected.set()
                self.stats["connects"] += 1
                self.stats["connected"] += 1
                backoff = 1.0
                for f in list(self.outbox):
                    self.send(f)
                try:
                    while True:
                        first, body = await read_packet(reader)
                        kind = first >> 4
                        if kind == 3:
                            _topic, pid, payload = publish_payload(first, body)
                            if pid is not None:
                                writer.write(puback_packet(pid))
                            self.on_ack(payload)
                        elif kind == 4:
                            self.on_puback(struct.unpack_from(">H", body)[0])
                            self.stats["pubacks"] += 1
                            if len(body) > 2 and body[2] >= 0x80:
                                self.stats["puback_errors"] += 1
                finally:
                    self.connected.clear()
                    self.writer = None
                    self.inflight.clear()
                    self.stats["connected"] -= 1
            except (OSError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, ValueError) as e:
                if not stop_all.is_set():  # not the end of the run's own DISCONNECT
                    self.stats["disconnects"] += 1
                    self.stats["last_error"] = f"{self.dev}: {type(e).__name__}: {e}"
            finally:
                writer.close()
            if not stop_all.is_set():
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 30)

    async def disconnect(self) -> None:
        if self.writer is not None:
            try:
                self.writer.write(DISCONNECT)
                await asyncio.wait_for(self.writer.drain(), 2)
            except (OSError, asyncio.TimeoutError, ssl.SSLError):
                pass


async def run_devices(devices: list[tuple[str, str, bytes]], opts: SimOptions, control, report) -> dict:
    """Run `devices` ((id, password, hmac key)) until control says stop and the outboxes
    drained (or the drain deadline). control(): None (run), "flush" (stop sampling, send the
    partial batches, drain), "end" (disconnect now). report(stats) is called every second."""
    ctx = ssl.create_default_context(cafile=opts.cafile)
    stats: dict = {k: 0 for k in COUNTERS}
    devs = [Device(d, pw, key, opts, ctx, stats) for d, pw, key in devices]
    stop_all = asyncio.Event()
    conns = []
    tasks: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones
    loop_start = time.monotonic()
    for i, d in enumerate(devs):  # staggered: TLS handshakes spread over the ramp
        delay = opts.ramp_s * i / max(1, len(devs))
        conns.append(asyncio.get_running_loop().call_later(delay, _start, d, stop_all, tasks))
    period = 1.0 / opts.rate
    # each device samples on its own phase so the fleet's PUBLISHes are spread over time
    phase = [opts.ramp_s * i / max(1, len(devs)) + period * ((i * 0.618) % 1.0) for i in range(len(devs))]
    due = [(loop_start + p, i) for i, p in enumerate(phase)]
    heapq.heapify(due)
    sampling = True
    last_report = last_resend = time.monotonic()
    while True:
        now = time.monotonic()
        state = control()
        if state == "end":
            break
        if sampling and state == "flush":
            sampling = False
            for d in devs:
                d.close_batch()
        if sampling:
            now_ms = int(time.time() * 1000)
            while due[0][0] <= now:
                t, i = due[0]
                devs[i].sample(now_ms)
                heapq.heapreplace(due, (t + period, i))
        if now - last_resend >= 1.0:
            for d in devs:
                d.resend_due(now)
                if d.writer is not None and now - d.last_tx > KEEPALIVE_S / 2:
                    d.writer.write(PINGREQ)
                    d.last_tx = now
            last_resend = now
        if now - last_report >= 1.0:
            stats["outbox"] = sum(d.outbox_records + len(d.pending) for d in devs)
            stats["last_error"] = stats.get("last_error", "")
            report(dict(stats))
            last_report = now
        await asyncio.sleep(min(0.05, period / 4))
    stop_all.set()
    await asyncio.gather(*(d.disconnect() for d in devs), return_exceptions=True)
    for d in devs:
        if d.writer is not None:
            d.writer.close()
    for c in conns:
        c.cancel()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stats["outbox"] = sum(d.outbox_records + len(d.pending) for d in devs)
    return {
        "stats": dict(stats),
        "samples": {d.dev: d.sample_ms for d in devs},
    }


def _start(d: Device, stop_all: asyncio.Event, tasks: set) -> None:
    tasks.add(asyncio.ensure_future(d.run_connection(stop_all)))
