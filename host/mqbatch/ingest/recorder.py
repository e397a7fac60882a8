"""The recorder: MQTT 5 shared-subscription consumer that lands every PUBLISH durably.

paho-mqtt 2.x, MQTT 5, TLS, QoS 1, `$share/GROUP/FILTER`, persistent session
(clean start off, Session Expiry > 0), manual acknowledgements. Nothing is
decoded or dropped here: malformed batches are landed like any other PUBLISH
and quarantined later by the Spark job, with their reason.

Durability: the MQTT network thread only queues what it receives. A writer
thread appends a group of messages to the landing WAL (one write), fsyncs it,
and only then are their PUBACKs sent, in the order the PUBLISHes arrived (group
commit: one fsync for everything that arrived meanwhile; the PUBACKs go out
from the network thread with its next PUBLISH, or from the writer when nothing
more is queued, see _commit). Segments roll into Parquet in the background. A recorder killed at
any moment has landed every PUBLISH it acknowledged; what it had not
acknowledged is redelivered by the broker from the persistent session
(possibly a second copy of something already landed: duplicates are allowed and
removed downstream, losses are not). Acknowledgements are never sent on a newer
connection than the one a message arrived on.

End-to-end acknowledgements (docs/e2e-ack.md, on unless e2e_ack=False): after the
group commit, every landed PUBLISH on mqbatch/<device>/telemetry with a valid
`batch-seq` property is acknowledged to its device on mqbatch/<device>/ack (QoS 1,
Message Expiry 3600 s), ranges merged per device and boot per commit group; sent
like the PUBACKs (from whichever thread sends those) and on any connection: they
are idempotent. At start the batches of the WAL replayed from the previous run are
acknowledged again.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import queue
import ssl
import sys
import threading
import time
from typing import Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from mqbatch.fleet.brokerconf import LIMITS
from mqbatch.ingest import e2eack, quota
from mqbatch.ingest.landing import Landed, LandingWriter, check_name, is_disk_error
from mqbatch.util import paho_compat

# CONNACK/SUBACK reason codes that mean the configuration is wrong (retrying cannot
# help): unsupported protocol version, client id not valid, bad user name or password,
# not authorized, banned, bad authentication method.
CONFIG_REFUSALS = frozenset({0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C})
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
DISK_RETRY_FIRST_S, DISK_RETRY_MAX_S = 1.0, 30.0  # back-off while the landing disk fails
# e2e ack PUBLISHes handed to paho and not yet PUBACKed by the broker, at most (and at most the
# broker's Receive Maximum, Mosquitto's max_inflight_messages: 20 by default); the acks that
# wait are merged per device (mqbatch.ingest.e2eack.AckBatcher), so a slow broker gets fewer,
# fuller acks instead of an unbounded queue in paho
E2E_IN_FLIGHT = 100


class _Stopping(Exception):
    """The recorder stops while landing is blocked by the disk."""  # back-off of the first connection (paho's for later ones: 1-10 s)


paho_compat.install()  # U+FEFF in a property must not kill the network thread (mqbatch.util.paho_compat)


def landed_from_message(msg: mqtt.MQTTMessage, received_at_us: int) -> Landed:
    """What the recorder lands of one PUBLISH paho parsed: topic, payload, the user
    properties in order, content type, payload format indicator, message expiry, QoS,
    retain, dup. Pure (no I/O); fuzzed by tests/security/fuzz_recorder_props.py."""
    props = msg.properties
    try:
        topic = msg.topic
    except UnicodeDecodeError:  # land it anyway; Spark quarantines the topic
        topic = msg._topic.decode("utf-8", "replace")
    return Landed(
        topic=topic,
        payload=bytes(msg.payload),
        user_properties=[(str(k), str(v)) for k, v in (getattr(props, "UserProperty", None) or [])],
        content_type=getattr(props, "ContentType", None),
        payload_format_indicator=getattr(props, "PayloadFormatIndicator", None),
        message_expiry_interval=getattr(props, "MessageExpiryInterval", None),
        qos=msg.qos,
        retain=bool(msg.retain),
        received_at_us=received_at_us,
        dup=bool(msg.dup),
    )


class RecorderError(RuntimeError):
    """The recorder cannot run (connection refused, not authorised, subscription rejected...)."""


class RecorderConfigError(RecorderError):
    """The recorder's configuration is wrong (e.g. it does not trust the broker's certificate): exit status 2."""


COMMIT_WAIT_MAX_S = 0.1  # the longest group commit wait RecorderConfig takes


@dataclasses.dataclass
class RecorderConfig:
    host: str
    port: int
    landing: str
    client_id: str = "mqbatch-recorder-1"  # also the recorder id in landing file names
    group: str = "mqbatch-recorders"
    topic_filter: str = "mqbatch/+/telemetry"
    cafile: str | None = None  # TLS is always on; None = the system's CAs
    certfile: str | None = None
    keyfile: str | None = None
    username: str | None = None
    password: str | None = None
    session_expiry: int = 3600  # seconds the broker keeps our session (and messages) while we are down
    receive_maximum: int = 100  # PUBLISHes in flight towards us
    # Maximum Packet Size sent in CONNECT: the broker never sends us a bigger packet, so a
    # hostile PUBLISH (e.g. 100,000 user properties: paho's own parser takes super-linear time,
    # and odd blocks still go to it, mqbatch.util.paho_compat) cannot stall the network thread.
    # At least the broker's own max_packet_size (docs/ingest.md, Limits).
    max_packet_size: int = LIMITS.recorder_max_packet_size
    keepalive: int = 30
    roll_bytes: int = 64 << 20
    roll_seconds: float = 60.0
    chunk_bytes: int = 8 << 20  # WAL bytes per Parquet row group when rolling: bounds the roll's memory
    commit_max: int = 1000  # most messages per fsync
    # group commit: woken by a message while fewer than a fifth of receive_maximum wait behind
    # it (and the broker may still send more: its window is not full), the writer waits this
    # long for more before the write and fsync (0: off). One fsync and one thread hand-over for
    # a group instead of each few messages: about 1 ms more latency, a fifth less CPU per
    # PUBLISH at full rate (docs/ingest.md, "group commit")
    commit_wait_s: float = 0.001
    progress_seconds: float = 5.0
    silence_warn_s: float = 60.0  # warn loudly after this long without a PUBLISH (0: never); see _check_silence
    e2e_ack: bool = True  # acknowledge batches with a batch-seq end to end (docs/e2e-ack.md)
    # per-device payload byte quota (mqbatch.ingest.quota); 0: none
    device_quota_bytes_per_s: int = 1 << 20
    device_quota_burst_bytes: int = 64 << 20

    def __post_init__(self):
        check_name(self.client_id)
        if not self.group or any(c in self.group for c in "/+#"):
            raise ValueError(f"share group {self.group!r} must be non-empty without '/', '+' or '#'")
        if self.session_expiry <= 0:
            raise ValueError("session_expiry must be > 0: the broker must keep messages while the recorder is down")
        if not 1 <= self.receive_maximum <= 65535:
            raise ValueError(f"receive_maximum must be 1..65535, got {self.receive_maximum}")
        if self.device_quota_bytes_per_s < 0 or self.device_quota_burst_bytes < 0:
            raise ValueError("device quota rate and burst must be >= 0 (0: no quota)")
        if bool(self.device_quota_bytes_per_s) != bool(self.device_quota_burst_bytes):
            raise ValueError("device quota: give both a rate and a burst (or 0 for both: no quota)")
        if 0 < self.device_quota_burst_bytes < self.max_packet_size:
            raise ValueError(
                f"device quota burst {self.device_quota_burst_bytes} B is smaller than one packet "
                f"({self.max_packet_size} B): no big batch would ever fit"
            )
        if not 0 <= self.commit_wait_s <= COMMIT_WAIT_MAX_S:
            raise ValueError(
                f"commit_wait_s must be 0..{COMMIT_WAIT_MAX_S:g} s (0: no group commit), got {self.commit_wait_s}"
            )
        if not 1024 <= self.max_packet_size <= 268435455:
            raise ValueError(f"max_packet_size must be 1024..268435455 bytes, got {self.max_packet_size}")

    @property
    def subscription(self) -> str:
        return f"$share/{self.group}/{self.topic_filter}"


@dataclasses.dataclass
class _Item:
    msg: Landed
    mid: int
    qos: int
    generation: int
    refused: bool = False  # over its device's quota: acknowledged, not landed (mqbatch.ingest.quota)


class Recorder:
    """Run with run(stop_event); stats in .received, .landed, .acked (PUBACKs), .files_rolled,
    .e2e (mqbatch.ingest.e2eack.AckBatcher: .acked, .invalid, .without batches; None with e2e acks
    off), .e2e_sent (ack PUBLISHes handed to paho), .e2e_refused (of those, refused by the
    broker in its PUBACK, or that paho could not queue); at most min(E2E_IN_FLIGHT, the broker's
    Receive Maximum) ack PUBLISHes are unacknowledged at a time."""

    def __init__(self, cfg: RecorderConfig, out: TextIO = sys.stderr):
        self.cfg = cfg
        self.out = out
        self.received = self.landed = self.acked = 0
        self.commits = 0  # groups written and fsync'd (received / commits: PUBLISHes per fsync)
        self.error: str | None = None
        self.config_error = False  # the error is bad configuration (exit status 2)
        self.landing_blocked = 0  # times landing was blocked by the disk (full, read-only, I/O error)
        self.disk_blocked = False  # blocked right now
        self._stopping = threading.Event()  # run() is ending: a blocked landing gives up
        self._net_problem: str | None = None  # the connection problem last logged (None: none)
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._durable: collections.deque[_Item] = collections.deque()  # landed (fsync'd), PUBACK not sent yet
        self._ack_lock = threading.Lock()
        self._generation = 0
        self._network_thread: threading.Thread | None = None  # paho's, once loop_start() ran
        self._subscribed = threading.Event()
        self._failed = threading.Event()
        self.e2e = e2eack.AckBatcher() if cfg.e2e_ack else None
        self.quota = (
            quota.DeviceQuota(cfg.device_quota_bytes_per_s, cfg.device_quota_burst_bytes)
            if cfg.device_quota_bytes_per_s
            else None
        )
        self._over_quota: set[str] = set()
        self.e2e_sent = self.e2e_refused = 0
        self._warned_seq = False
        self._e2e_mids: set[int] = set()  # ack PUBLISHes handed to paho, not yet PUBACKed by the broker
        self._e2e_early: set[int] = set()  # PUBACKed before publish() returned their mid
        self._mid_lock = threading.Lock()  # for the two sets; never held while calling paho
        self._acks_closed = False  # on the way out, after _finish_acks: no more e2e acks handed to paho
        self.e2e_unconfirmed = 0  # ack PUBLISHes still unacknowledged by the broker when the recorder stopped
        self._e2e_window = E2E_IN_FLIGHT  # min(E2E_IN_FLIGHT, the broker's Receive Maximum) once connected
        self._e2e_props = Properties(PacketTypes.PUBLISH)
        self._e2e_props.MessageExpiryInterval = e2eack.MESSAGE_EXPIRY_S
        self.client = self._make_client()
        self.writer = LandingWriter(
            cfg.landing,
            cfg.client_id,
            cfg.roll_bytes,
            cfg.roll_seconds,
            cfg.chunk_bytes,
            on_replay=self._note_e2e if self.e2e is not None else None,
        )
        if self.e2e is not None and self.e2e:  # sent once connected (_send_acks)
            self._say(
                f"{self.e2e.acked} replayed batches will be acknowledged end to end again ({self.e2e.waiting} devices)"
            )
        if self.writer.recovery_error is not None:
            e = self.writer.recovery_error
            self._say(
                f"cannot convert the previous run's WAL yet ({errno.errorcode.get(e.errno or 0, e.errno)}: {e}): "
                f"it stays in {self.writer.wal_dir}; landing starts blocked and retries"
            )
        for path in self.writer.recovered:
            self._say(f"recovered the previous run's open segment into {path.name}")
        for name, n in self.writer.torn:
            self._say(f"{name}: dropped a torn last frame of {n} bytes (never acknowledged; the broker redelivers it)")

    @property
    def files_rolled(self) -> int:
        return self.writer.files_rolled

    def _say(self, text: str) -> None:
        print(f"ingest: {text}", file=self.out, flush=True)

    # -- MQTT --------------------------------------------------------------------
    def _make_client(self) -> mqtt.Client:
        cfg = self.cfg
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cfg.client_id, protocol=mqtt.MQTTv5, manual_ack=True)
        try:
            c.tls_set(ca_certs=cfg.cafile, certfile=cfg.certfile, keyfile=cfg.keyfile, cert_reqs=ssl.CERT_REQUIRED)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise RecorderError(
                f"TLS set-up failed (cafile={cfg.cafile}, cert={cfg.certfile}, key={cfg.keyfile}): {e}"
            ) from None
        if cfg.username is not None:
            c.username_pw_set(cfg.username, cfg.password)
        c.reconnect_delay_set(1, 10)
        c.on_connect = self._on_connect
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        c.max_inflight_messages_set(E2E_IN_FLIGHT)  # paho's own window, fixed once connected
        return c

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            text = f"broker refused the connection: {reason_code} ({reason_code.value:#04x})"
            if reason_code.value in CONFIG_REFUSALS:  # retrying cannot help: the configuration is wrong
                self._fail(f"{text}: check --username, --password-file/--cert and --client-id", config=True)
            else:  # server unavailable, busy, quota, rate...: paho reconnects with back-off
                self._net_state(f"{text}; retrying with back-off")
            return
        self._net_state(None)
        self._generation += 1
        # MQTT 5 3.3.4: at most Receive Maximum QoS 1 PUBLISHes unacknowledged (65,535 if absent);
        # paho does not apply it itself (_send_acks does). The acks still in flight are sent again by paho.
        self._e2e_window = min(E2E_IN_FLIGHT, getattr(properties, "ReceiveMaximum", 65535))
        self._say(
            f"connected to {self.cfg.host}:{self.cfg.port} as {self.cfg.client_id} "
            f"(session present: {bool(flags.session_present)}), subscribing {self.cfg.subscription}"
        )
        client.subscribe(self.cfg.subscription, options=SubscribeOptions(qos=1))

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        bad = [rc for rc in reason_codes if rc.is_failure]
        if bad:
            self._fail(
                f"subscription {self.cfg.subscription} rejected: {bad[0]} ({bad[0].value:#04x}): the broker's "
                f"policy does not let this account join the share group (check --group, --filter, the account)",
                config=bad[0].value in CONFIG_REFUSALS,
            )
        else:
            self._say(f"subscribed {self.cfg.subscription} (granted QoS {reason_codes[0].value})")
            self._subscribed.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self._generation += 1  # what arrived before must not be acked on the next connection
        if not self._failed.is_set():
            self._say(f"disconnected: {reason_code}")

    def _on_message(self, client, userdata, msg: mqtt.MQTTMessage):
        landed = landed_from_message(msg, time.time_ns() // 1000)
        refused = False
        if self.quota is not None:
            device = quota.device_of(landed.topic)
            refused = not self.quota.admit(device, len(landed.payload), time.monotonic())
            if refused != (device in self._over_quota):
                self._quota_state(device, refused)
        # in the queue either way: PUBACKs go out in arrival order ([MQTT-4.6.0-2])
        self._queue.put(_Item(landed, msg.mid, msg.qos, self._generation, refused))
        if self._durable or self._acks_waiting():
            self._send_acks()  # here, PUBACKs go out in this loop pass (see _commit)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        """The broker's PUBACK of an e2e ack: room for the next ones (merged while they waited).
        Runs inside paho's lock on its outgoing messages, so it sends only if no other
        thread is sending (that one would wait for paho's lock: a deadlock); else the next
        PUBLISH or the writer's next pass does (0.2 s, or the disk back-off while landing is blocked)."""
        with self._mid_lock:
            if mid in self._e2e_mids:
                self._e2e_mids.remove(mid)
            else:
                self._e2e_early.add(mid)
        if reason_code.is_failure:
            self.e2e_refused += 1
            if self.e2e_refused == 1:
                self._say(
                    f"the broker refused an e2e ack PUBLISH: {reason_code} ({reason_code.value:#04x}); "
                    f"its device publishes those batches again (counted; reported once)"
                )
        if self._acks_waiting():
            self._send_acks(blocking=False)

    def _acks_waiting(self) -> bool:
        return self.e2e is not None and bool(self.e2e) and len(self._e2e_mids) < self._e2e_window

    def _quota_state(self, device: str, over: bool) -> None:
        """One line when a device goes over its quota, and one when it is back within it."""
        assert self.quota is not None
        if over:
            self._over_quota.add(device)
            self._say(
                f"device {device[:64]!r} is over its quota ({self.cfg.device_quota_bytes_per_s} B/s, burst "
                f"{self.cfg.device_quota_burst_bytes} B): its PUBLISHes are acknowledged but not landed "
                f"(no end-to-end ack: a device with an outbox sends them again); counted"
            )
        else:
            self._over_quota.discard(device)
            self._say(f"device {device[:64]!r} is within its quota again ({self.quota.by_device[device]} refused)")

    def _fail(self, text: str, config: bool = False) -> None:
        """Stop with an error: exit status 2 if the configuration is wrong (refused
        credentials or rights: retrying cannot help), else 1."""
        self.error = text
        self.config_error = self.config_error or config
        self._say(f"error: {text}")
        self._failed.set()

    def _net_state(self, text: str | None) -> None:
        """Log a change of the connection's state once (None: connected), not every retry."""
        if text != self._net_problem:
            if text is not None:
                self._say(text)
            elif self._net_problem is not None:
                self._say(f"reachable again: {self.cfg.host}:{self.cfg.port}")
            self._net_problem = text

    def _connect_first(self, stop: threading.Event, props: Properties) -> bool:
        """The first connection, retried like every later one (paho's reconnect_delay):
        a recorder started while the broker is down or flooded waits for it instead of
        exiting. Only an untrusted server certificate is final (a wrong --cafile or
        --host). Returns False if `stop` was set before a connection was made."""
        cfg, delay = self.cfg, RETRY_FIRST_S
        while not stop.is_set():
            try:
                self.client.connect(cfg.host, cfg.port, keepalive=cfg.keepalive, clean_start=False, properties=props)
                return True
            except ssl.SSLCertVerificationError as e:
                raise RecorderConfigError(
                    f"the broker {cfg.host}:{cfg.port} presented a certificate this recorder does not trust "
                    f"({e.verify_message}): check --cafile and --host"
                ) from None
            except (OSError, ssl.SSLError) as e:
                kind = type(e).__name__ + (f" {errno.errorcode.get(e.errno, e.errno)}" if e.errno else "")
                self._net_state(
                    f"cannot connect to {cfg.host}:{cfg.port} ({kind}: {e}); retrying with back-off "
                    f"({RETRY_FIRST_S:.0f} s doubling to {RETRY_MAX_S:.0f} s), one line per change"
                )
                stop.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        return False

    # -- landing -----------------------------------------------------------------
    def _commit(self, items: list[_Item]) -> None:
        kept = [it for it in items if not it.refused]
        self._land(kept)  # durable before any PUBACK goes out
        self.landed += len(kept)
        if self.e2e is not None:
            self._note_e2e(it.msg for it in kept)  # ranges merged per device when handed out
        self._durable.extend(it for it in items if it.qos > 0)
        if self._queue.empty():
            self._send_acks()
        # else the network thread sends them with its next PUBLISH (_on_message): an ack
        # queued from this thread wakes paho's network loop for one extra pass each time,
        # which cost more CPU than the landing itself. If no PUBLISH comes (all in flight
        # are queued here), this thread empties the queue and sends them on its next commit.

    def _land(self, items: list[_Item]) -> None:
        """Append and fsync `items` (and first finish what an earlier disk error left:
        LandingWriter.repair). On a disk error (full, read-only, I/O: landing.DISK_ERRNOS)
        nothing is acknowledged and nothing more is taken from the queue, so the broker
        stops sending (at most --receive-maximum PUBLISHes are unacknowledged) and keeps
        queuing; the same items are retried with back-off (1 s doubling to 30 s) until
        they are durable, with one line per change of state. Raises _Stopping if the
        recorder is stopped meanwhile (the items are then neither landed nor acked:
        the broker redelivers them)."""
        delay, since, last = DISK_RETRY_FIRST_S, 0.0, None
        while True:
            try:
                if self.writer.needs_repair:
                    self.writer.repair()  # acks of what it replays wait in self.e2e
                for it in items:
                    self.writer.append(it.msg)
                self.writer.commit()
                break
            except OSError as e:
                if not is_disk_error(e):
                    raise
                self.writer.abandon()
                state = errno.errorcode.get(e.errno or 0, str(e.errno))
                if last is None:
                    since = time.monotonic()
                    self.landing_blocked += 1
                if state != last:
                    self._say(
                        f"landing blocked: {state}: {e}. Nothing more is acknowledged or taken from the broker "
                        f"(it keeps the messages); retrying with back-off, every {DISK_RETRY_MAX_S:.0f} s at most"
                    )
                    last = state
                self.disk_blocked = True
                if self._stopping.wait(delay):
                    raise _Stopping() from None
                delay = min(delay * 2, DISK_RETRY_MAX_S)
        if last is not None:
            self.disk_blocked = False
            self._say(f"landing resumed after {time.monotonic() - since:.1f} s blocked ({last}); acknowledging again")

    def _note_e2e(self, msgs) -> None:
        """Collect the e2e ack ranges of landed (or replayed) messages; warn about the first bad batch-seq."""
        assert self.e2e is not None  # only called with e2e acks on
        first_bad = None
        with self._ack_lock:  # once per group: _send_acks takes from it in the network thread
            for m in msgs:
                if not self.e2e.add(m.topic, m.user_properties) and self.e2e.invalid == 1 and first_bad is None:
                    first_bad = m
        if first_bad is not None and not self._warned_seq:
            self._warned_seq = True
            seq = [v for k, v in first_bad.user_properties if k == e2eack.PROPERTY][:2]
            self._say(
                f"a PUBLISH on {first_bad.topic[:80]!r} has an invalid {e2eack.PROPERTY} property {seq!r} "
                f"or topic: landed, not acknowledged end to end (counted; reported once)"
            )

    def _send_acks(self, blocking: bool = True) -> None:
        """PUBACK what is durable, in arrival order, then publish its e2e acks; from either
        thread, one at a time. E2e acks wait for a connection but not for the one their
        batches came on (they are idempotent); paho keeps a QoS 1 ack across a reconnect.
        At most the window (the broker's Receive Maximum, E2E_IN_FLIGHT) is handed to paho
        unacknowledged; the rest waits in self.e2e, merged per device, and goes out as
        PUBACKs come back (_on_publish)."""
        if not self._ack_lock.acquire(blocking):
            return
        try:
            while self._durable:
                it = self._durable.popleft()
                if it.generation == self._generation:
                    if self.client.ack(it.mid, it.qos) == mqtt.MQTT_ERR_SUCCESS:
                        self.acked += 1
            if self.e2e is None or self._acks_closed or not self.client.is_connected():
                return
            for topic, payload in self.e2e.take(self._e2e_window - len(self._e2e_mids)):
                info = self.client.publish(topic, payload, qos=1, properties=self._e2e_props)
                if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):  # NO_CONN: paho keeps it
                    self.e2e_refused += 1  # not queued by paho: its device publishes those batches again
                    continue
                mid = info.mid
                with self._mid_lock:
                    if mid in self._e2e_early:
                        self._e2e_early.remove(mid)
                    else:
                        self._e2e_mids.add(mid)
                self.e2e_sent += 1
        finally:
            self._ack_lock.release()

    def _writer_loop(self, done: threading.Event) -> None:
        try:
            if self.writer.needs_repair:
                self._land([])
            self._land_until_sentinel()
        except _Stopping:
            self._say(
                "stopped while landing was blocked: what was not landed is not acknowledged (the broker keeps it)"
            )
        except Exception as e:  # any landing failure (disk full, I/O error) stops the recorder, loudly
            self._fail(f"landing failed, nothing more is acknowledged: {type(e).__name__}: {e}")
        finally:
            done.set()

    def _land_until_sentinel(self) -> None:
        last_report, last_count, quiet_for = time.monotonic(), 0, 0
        finished = False
        wait, few, window = self.cfg.commit_wait_s, max(1, self.cfg.receive_maximum // 5), self.cfg.receive_maximum
        while not finished:
            items = []
            try:
                first = self._queue.get(timeout=0.2)
                finished = first is None
                if first is not None:
                    items.append(first)
                    waiting = self._queue.qsize()
                    # group commit (RecorderConfig.commit_wait_s), unless enough wait already or the
                    # broker's window is full (all it may send unacknowledged is queued or landed)
                    if wait and waiting < few and waiting + 1 + len(self._durable) < window:
                        time.sleep(wait)
                while len(items) < self.cfg.commit_max and not finished:
                    nxt = self._queue.get_nowait()
                    finished = nxt is None
                    if nxt is not None:
                        items.append(nxt)
            except queue.Empty:
                pass
            if items:
                self.received += len(items)
                self.commits += 1
                self._commit(items)
            elif self._durable or self._acks_waiting():
                self._send_acks()
            if self.writer.needs_repair:  # a background roll met a disk error: wait it out
                self._land([])
            if self.writer.due():  # converted in the background: PUBACKs go on meanwhile
                try:
                    self.writer.roll_in_background()
                except OSError as e:
                    if not is_disk_error(e):
                        raise
                    self.writer.abandon()  # its committed frames are converted by repair()
                    self._land([])
            while self.writer.rolled:
                path = self.writer.rolled.pop(0)
                if path is not None:
                    self._say(f"rolled {path.name}")
            now = time.monotonic()
            if now - last_report >= self.cfg.progress_seconds:
                quiet_for = quiet_for + 1 if self.landed == last_count else 0
                if quiet_for == 0 or quiet_for % 12 == 1:  # while idle, one line in 12 (a minute by default)
                    rate = (self.landed - last_count) / (now - last_report)
                    self._say(
                        f"{rate:.0f} msg/s, {self.landed} PUBLISHes landed, {self.acked} acked, "
                        f"{self.files_rolled} files rolled, {self.writer.pending_rows} in the open segment"
                    )
                last_report, last_count = now, self.landed
        self._send_acks()  # what the last commit landed (the stream has ended)

    # -- silence watchdog ----------------------------------------------------------
    def _check_silence(self, now: float) -> None:
        """Mosquitto answers SUBSCRIBE with "granted QoS 1" even when the ACL lets this
        account read none of the filter's topics, and then delivers nothing, forever.
        No probe can tell (the recorder may write nowhere it can read: least privilege),
        so the recorder watches the stream: after cfg.silence_warn_s seconds without a
        PUBLISH (since subscribing, or since the last one) it warns loudly on stderr,
        and again after 2x, 4x, ... that time while the silence lasts."""
        if not self.cfg.silence_warn_s or not self._subscribed.is_set():
            return
        seen = self.received + self._queue.qsize()
        watch = getattr(self, "_silence", None)  # (PUBLISHes seen, silent since, next warning after s)
        if watch is None or watch[0] != seen:
            self._silence = (seen, now, self.cfg.silence_warn_s)
            return
        _, since, warn_after = watch
        if now - since < warn_after:
            return
        self._silence = (seen, since, warn_after * 2)
        cfg = self.cfg
        who = f"account {cfg.username!r}" if cfg.username else "this client (certificate identity)"
        self._say(
            f"WARNING: no PUBLISH for {now - since:.0f} s {'since subscribing' if not seen else 'since the last one'}"
            f" on {cfg.subscription}. If devices are publishing, the broker may not let {who} read "
            f"{cfg.topic_filter}: Mosquitto grants such a subscription and then silently delivers nothing. "
            f"Check the broker ACL (`topic read {cfg.topic_filter}` for that user) and --filter. "
            f"(--silence-warn-s 0 turns this warning off.)"
        )

    def _check_network_thread(self) -> None:
        """paho's network thread ends on an exception it does not handle (its traceback goes
        to stderr): say so and stop with exit 1 instead of landing nothing while looking alive.
        (paho 2.1.0 keeps the thread in Client._thread while it runs; there is no public accessor.)"""
        thread = self._network_thread
        if thread is not None and not thread.is_alive() and not self._failed.is_set():
            self._fail(
                "the MQTT network thread ended unexpectedly (its traceback is above): nothing more would "
                "be received; stopping. What was landed was acknowledged; the broker redelivers the rest"
            )

    def _finish_acks(self, timeout: float = 5.0) -> None:
        """On the way out: the e2e acks still waiting for room under the broker's Receive
        Maximum go out as the broker PUBACKs the ones in flight (for `timeout` at most; what
        is left is said in the stop line, and its devices publish those batches again)."""
        deadline = time.monotonic() + timeout
        while self.e2e is not None and (self.e2e or self._e2e_mids) and time.monotonic() < deadline:
            if not self.client.is_connected():
                break
            self._send_acks()
            time.sleep(0.01)
        with self._ack_lock:
            self._acks_closed = True

    def _give_up_unconfirmed_acks(self) -> None:
        """paho's loop ends only once every QoS 1 PUBLISH it holds is acknowledged: the e2e
        acks the broker has not PUBACKed by now are given up (counted; idempotent, their
        devices publish those batches again), so the stop never waits on the broker. paho 2.1
        has no public call for this: its _out_messages, under its own lock."""
        client: Any = self.client
        with client._out_message_mutex:
            self.e2e_unconfirmed = len(client._out_messages)
            client._out_messages.clear()
            client._inflight_messages = 0

    def _stop_network_loop(self) -> None:
        """loop_stop() without the wait for paho's select() timeout (1 s): wake it first.
        paho 2.1 wakes its loop through a socket pair only from its own calls."""
        client: Any = self.client
        client._thread_terminate = True
        wake = getattr(client, "_sockpairW", None)
        if wake is not None:
            try:
                wake.send(b"0")
            except OSError:  # full or closed: the loop wakes by its timeout
                pass
        client.loop_stop()

    def _close_connection(self, timeout: float = 5.0) -> None:
        """Disconnect without losing the last PUBACKs. paho writes DISCONNECT and closes the
        socket at once; the broker keeps sending PUBLISHes until it reads the DISCONNECT, and
        closing a socket with unread data makes the kernel send a reset, which discards what
        the broker had received but not yet read: the last PUBACKs (and the DISCONNECT: Mosquitto
        logs "Protocol error"), so acknowledged messages came back as duplicates (seen in
        tests/ingest/test_ingest.py::test_recorder_offline_periods...). So: let paho write
        what is queued, stop its loop, send DISCONNECT ourselves and read (and drop: they are
        not acknowledged, the broker redelivers them) until the broker closes the connection."""
        client = self.client
        self._give_up_unconfirmed_acks()
        if self._network_thread is None or not client.is_connected():
            client.disconnect()
            self._stop_network_loop()
            return
        deadline = time.monotonic() + timeout
        # paho 2.1 keeps unsent packets in Client._out_packet (no public accessor)
        while client._out_packet and time.monotonic() < deadline:
            time.sleep(0.01)
        if client._out_packet:  # the broker reads nothing: paho's loop would wait for them (keep-alive)
            self._say(f"the broker took nothing for {timeout:.0f} s: closing without DISCONNECT")
            client._sock_close()
        self._stop_network_loop()
        sock: Any = client.socket()  # the ssl.SSLSocket paho made (typed as its SocketLike protocol)
        if sock is None:
            return
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            for pkt in list(getattr(client, "_out_packet", None) or ()):  # the rest of a partly written packet
                sock.sendall(pkt["packet"][pkt["pos"] :])
            sock.sendall(b"\xe0\x00")  # DISCONNECT, reason 0x00 Normal disconnection
            self._say("disconnected: Normal disconnection")
            while sock.recv(65536):
                pass  # PUBLISHes sent before the broker read our DISCONNECT: not acknowledged
        except (OSError, ssl.SSLError):
            pass
        finally:
            self._generation += 1
            client._sock_close()  # paho's own close (it also forgets the socket)

    # -- lifecycle ---------------------------------------------------------------
    def run(self, stop: threading.Event, connect_timeout: float = 30.0) -> int:
        """Record until `stop` is set (or a fatal error). Returns an exit status."""
        cfg = self.cfg
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = cfg.session_expiry
        props.ReceiveMaximum = cfg.receive_maximum
        props.MaximumPacketSize = cfg.max_packet_size
        writer_done = threading.Event()
        writer = threading.Thread(target=self._writer_loop, args=(writer_done,), name="landing-writer", daemon=True)
        writer.start()
        try:
            if self._connect_first(stop, props):
                self.client.loop_start()
                self._network_thread = self.client._thread
            deadline = time.monotonic() + connect_timeout
            while not (stop.is_set() or self._failed.is_set() or self._subscribed.is_set()):
                if deadline and time.monotonic() > deadline:  # paho keeps trying: say so once
                    self._say(f"no CONNACK/SUBACK from {cfg.host}:{cfg.port} within {connect_timeout} s; still trying")
                    deadline = 0
                self._check_network_thread()
                time.sleep(0.05)
            while not (stop.is_set() or self._failed.is_set()):
                stop.wait(0.2)
                self._check_silence(time.monotonic())
                self._check_network_thread()
        finally:
            # land and acknowledge what is queued, then disconnect (the session and its
            # undelivered messages stay on the broker). Whatever arrives after that is
            # neither landed nor acknowledged: the broker redelivers it on reconnect, so a
            # clean stop leaves no duplicate behind.
            self._stopping.set()
            self._queue.put(None)
            writer_done.wait(60)
            try:
                self._finish_acks()
                self._close_connection()
            except Exception as e:  # never skips the final roll below
                self._fail(f"closing the MQTT connection failed: {type(e).__name__}: {e}")
            left = self._queue.qsize()
            try:
                path = self.writer.close()
            except OSError as e:  # the WAL stays; the next start converts it
                path = None
                self._fail(
                    f"could not roll the open segment into Parquet ({e}); its WAL is kept "
                    f"in {self.writer.wal_dir} and converted at the next start"
                )
            e2e = self.e2e
            self._say(
                f"stopped: {self.landed} PUBLISHes landed, {self.acked} acked, "
                f"{self.files_rolled} files rolled{f', last {path.name}' if path else ''}"
                f"{f', {left} unacknowledged left to the broker' if left else ''}"
                + (
                    f"; over quota: {self.quota.refused} PUBLISHes ({self.quota.refused_bytes} B) refused, from "
                    f"{len(self.quota.by_device)} devices"
                    if self.quota is not None
                    else "; no device quota"
                )
                + (
                    f"; e2e acks: {e2e.acked} batches in {self.e2e_sent} ack PUBLISHes, {e2e.invalid} with an "
                    f"invalid batch-seq, {e2e.without} without one"
                    f"{f', {e2e.waiting} devices with acks not sent' if e2e else ''}"
                    f"{f', {self.e2e_unconfirmed} ack PUBLISHes not confirmed' if self.e2e_unconfirmed else ''}"
                    f"{f', {self.e2e_refused} refused by the broker or not queued by paho' if self.e2e_refused else ''}"
                    f"{f', {e2e.dropped} ack ranges dropped (over the pending bound)' if e2e.dropped else ''}"
                    if e2e is not None
                    else "; e2e acks off"
                )
            )
        return (2 if self.config_error else 1) if self.error else 0
