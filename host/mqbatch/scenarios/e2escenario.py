"""Scenario harness for issue 16's proof: does a fault lose records, with end-to-end
acks on and off? (docs/e2e-ack.md; the figures go to docs/reliability.md.)

One run = one scenario, one device kind, e2e on or off: a LocalStack (real Mosquitto,
TLS, the brokerconf policy, persistence), the real recorder as a child process
(`mqbatch ingest`, mqbatch.lab.recproc: SIGKILL-able), N devices, the fault, then a
drain; then the count

    stored on the devices  =  unique (device, boot, seq) landed  +  counted dropped  +  LOST

"unique landed" is decoded from the landing zone with the Spark job's parsers
(mqbatch.wire.codec, mqbatch.wire.records; duplicates counted once), "dropped" is what the
devices counted (outbox policy). LOST must be 0 with e2e acks on.

Device kinds:
- "virtual": `VirtualDevice`, a paho-mqtt device that keeps an outbox per
  docs/e2e-ack.md section 3 (entry removed on a covering ack, resent after
  resend_after_s; e2e off: removed on a success PUBACK, as the firmware does
  without e2e acks); faster than the firmware.
- "firmware": the real firmware in the MicroPython Unix port (mqbatch.lab.devices.Fleet),
  its config with ``"e2e_ack": {"enabled": <e2e>, "resend_after_s": ...}``.

Scenarios (`SCENARIOS`): broker-kill-recorder-down (the issue's measured case: the
recorder is stopped, messages queue for its session, the broker is SIGKILLed),
broker-kills (SIGKILLs at random moments), recorder-kills (SIGKILLs at random
moments, between landing and ack among them), recorder-down-over-queue-limit
(the broker's queue for the recorder overflows), and issue 22's: recorder-down,
recorder-kills-10s, disk-full (mqbatch.scenarios.diskfull: the landing disk full, then
freed; root), stream-kills (mqbatch.scenarios.streamkills: `mqbatch spark --stream`
SIGKILLed and restarted; its outputs checked against what landed). Their own checks go
to Result.checks / Result.problems.

    .venv/bin/python tools/e2e_scenarios.py --devices 3 --kind virtual     # all scenarios, e2e on and off
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import random
import secrets
import ssl
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.fleet.brokerconf import ACK_TOPICS, TELEMETRY_FILTER, Limits
from mqbatch.ingest import e2eack, landing
from mqbatch.lab.broker import Mosquitto
from mqbatch.lab.recproc import RecorderProcess
from mqbatch.lab.stack import RECORDER_CLIENT_ID, LocalStack
from mqbatch.scenarios.diskfull import Tmpfs, disk_full
from mqbatch.scenarios.e2edevice import batch
from mqbatch.scenarios.streamkills import spark_report_check, stream_kills
from mqbatch.wire import codec, records

INTRUDER = "intruder"  # a device account of the stack that no device uses


class VirtualDevice:
    """A device per docs/e2e-ack.md section 3, in Python with paho-mqtt: every period_s a
    batch of batch_records records of one boot goes into the outbox (stored) and is
    published (QoS 1, batch-seq if e2e). e2e on: an entry leaves the outbox when an ack
    range covers it; PUBACKed entries not covered within resend_after_s are published
    again (resends). e2e off: a success PUBACK removes it (as the firmware without e2e acks).
    Subscribes to its ack topic after every CONNACK (Clean Start, no session)."""

    def __init__(
        self,
        host: str,
        port: int,
        cafile,
        device_id: str,
        password: str,
        *,
        e2e: bool,
        boot: int = 1,
        batch_records: int = 10,
        period_s: float = 0.05,
        resend_after_s: float = 3.0,
    ):
        self.id, self.e2e, self.boot = device_id, e2e, boot
        self.batch_records, self.period_s, self.resend_after_s = batch_records, period_s, resend_after_s
        self.stored: set[tuple[str, int, int]] = set()
        self.outbox: dict[tuple[int, int, int], float | None] = {}  # entry -> PUBACK time (None: not yet)
        self.dropped = self.resends = self.bad_acks = self.refused = 0
        self._mids: dict[int, tuple[int, int, int]] = {}
        self._early: dict[int, object] = {}  # PUBACK reason codes that came before _publish noted the mid
        self._lock = threading.Lock()
        self._next_seq = 0
        self._stop = threading.Event()
        self._producing = threading.Event()
        self._producing.set()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=str(cafile), cert_reqs=ssl.CERT_REQUIRED)
        c.username_pw_set(device_id, password)
        c.max_inflight_messages_set(20)
        c.reconnect_delay_set(0.2, 2)
        c.on_connect = self._on_connect
        c.on_publish = self._on_publish
        c.on_message = self._on_message
        self.client = c
        c.connect_async(host, port, keepalive=10, clean_start=True)
        c.loop_start()
        self._thread = threading.Thread(target=self._run, name=f"vdev-{device_id}", daemon=True)
        self._thread.start()

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if not reason_code.is_failure and self.e2e:
            client.subscribe(e2eack.ack_topic(self.id), qos=1)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        with self._lock:
            entry = self._mids.pop(mid, None)
            if entry is None:  # PUBACK before _publish noted the mid
                self._early[mid] = reason_code
                return
            self._puback(entry, reason_code)

    def _puback(self, entry, reason_code) -> None:
        if entry in self.outbox:  # else covered by an ack already
            if reason_code.is_failure:
                self.refused += 1  # stays; published again after resend_after_s
                self.outbox[entry] = time.monotonic()
            elif self.e2e:
                self.outbox[entry] = time.monotonic()  # awaiting its e2e ack
            else:
                del self.outbox[entry]  # PUBACK ends the line

    def _on_message(self, client, userdata, msg):
        try:
            ranges = e2eack.decode(msg.payload)
        except e2eack.AckError:
            self.bad_acks += 1
            return
        with self._lock:
            for entry in [
                e for e in self.outbox if any(b == e[0] and f <= e[1] and e[2] <= last for b, f, last in ranges)
            ]:
                del self.outbox[entry]

    def _publish(self, entry: tuple[int, int, int]) -> None:
        """Called without self._lock held: paho calls on_publish holding its own lock."""
        props, payload = batch(*entry)
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = list(props) + ([(e2eack.PROPERTY, e2eack.format_batch_seq(*entry))] if self.e2e else [])
        info = self.client.publish(f"mqbatch/{self.id}/telemetry", payload, qos=1, properties=p)
        with self._lock:  # paho keeps the message (and resends it after a reconnect)
            early = self._early.pop(info.mid, None)
            if early is None:
                self._mids[info.mid] = entry
            else:
                self._puback(entry, early)

    def _run(self) -> None:
        next_batch = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            send = []
            with self._lock:
                if self._producing.is_set() and now >= next_batch:
                    entry = (self.boot, self._next_seq, self._next_seq + self.batch_records - 1)
                    self._next_seq += self.batch_records
                    self.stored.update((self.id, self.boot, s) for s in range(entry[1], entry[2] + 1))
                    self.outbox[entry] = None
                    send.append(entry)
                    next_batch = now + self.period_s
                for entry, acked_at in list(self.outbox.items()):
                    if acked_at is not None and now - acked_at >= self.resend_after_s:
                        self.outbox[entry] = None
                        self.resends += 1
                        send.append(entry)
            for entry in send:
                self._publish(entry)
            time.sleep(0.01)

    def stop_producing(self) -> None:
        self._producing.clear()

    def drained(self) -> bool:
        with self._lock:
            return not self.outbox

    def close(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        self.client.disconnect()
        self.client.loop_stop()
        return {
            "left_in_outbox": len(self.outbox),
            "resends": self.resends,
            "refused": self.refused,
            "bad_acks": self.bad_acks,
        }


@dataclasses.dataclass
class Result:
    scenario: str
    kind: str
    e2e: bool
    devices: int
    stored: int
    unique_landed: int
    duplicates: int
    dropped: int
    faults: list[str]
    device_stats: dict
    released: int = 0  # records the devices released unconfirmed (PUBACKed, e2e ack not in; issue 22)
    checks: dict = dataclasses.field(default_factory=dict)  # scenario-specific figures (disk-full, stream-kills)
    problems: list = dataclasses.field(default_factory=list)  # what a scenario's own checks found wrong

    @property
    def released_not_landed(self) -> int:
        """Of the released records, those absent (what the devices counted dropped never landed)."""
        return min(self.released, max(0, self.stored - self.unique_landed - self.dropped))

    @property
    def lost(self) -> int:
        """Stored, not landed and counted by no device counter (negative: dropped over-counts)."""
        return self.stored - self.unique_landed - self.dropped - self.released_not_landed

    def line(self) -> str:
        return (
            f"{self.scenario:32s} {self.kind:8s} e2e {'on ' if self.e2e else 'off'}: stored {self.stored:6d}, "
            f"unique landed {self.unique_landed:6d}, dropped {self.dropped:4d}, released unconfirmed "
            f"{self.released} ({self.released - self.released_not_landed} landed), LOST {self.lost:5d} "
            f"({100 * self.lost / max(self.stored, 1):.1f} %), duplicates {self.duplicates}, "
            f"faults: {'; '.join(f'{f} x{n}' if n > 1 else f for f, n in collections.Counter(self.faults).items())}"
            + "".join(f"\n    {k}: {json.dumps(v, sort_keys=True)}" for k, v in self.checks.items())
            + "".join(f"\n    PROBLEM: {p}" for p in self.problems)
        )


def landed_records(landing_dir) -> tuple[set[tuple[str, int, int]], int]:
    """Unique (device, boot, seq) in the landing zone, and how many duplicates."""
    seen, dups = set(), 0
    for r in landing.read_landing(landing_dir).to_pylist():
        try:
            dev = records.device_from_topic(r["topic"])
        except records.RecordError:
            continue
        res = codec.decode([(p["key"], p["value"]) for p in r["user_properties"]], r["payload"])
        for m in res.messages:
            try:
                rec = records.parse(m)
            except records.RecordError:
                continue
            key = (dev, rec.boot, rec.seq)
            dups += key in seen
            seen.add(key)
    return seen, dups


class Harness:
    """The stack, the recorder and the devices of one run. Scenario functions drive it."""

    def __init__(
        self,
        run_dir,
        *,
        devices: int,
        kind: str,
        e2e: bool,
        limits: Limits | None = None,
        resend_after_s: float = 3.0,
        misconfigured: bool = False,
        say=print,
        sample_hz: float | None = None,
        outage_s: float = 300.0,
        disk_full_s: float = 60.0,
        tmpfs_landing_mb: int | None = None,
        recorder_args: tuple[str, ...] = (),
    ):
        if kind not in ("virtual", "firmware"):
            raise ValueError(f"device kind {kind!r}: 'virtual' or 'firmware'")
        self.dir = pathlib.Path(run_dir)
        self.kind, self.e2e, self.resend_after_s, self.say = kind, e2e, resend_after_s, say
        # sample_hz: the firmware at the demo's configuration (scenarios.demo.DEVICE_CONFIG) at this
        # rate, resend_after_s included; None: the harness's own (50 Hz, batches of 20)
        self.sample_hz, self.outage_s, self.disk_full_s = sample_hz, outage_s, disk_full_s
        self.checks: dict = {}  # a scenario's own figures and problems, into the Result
        self.problems: list[str] = []
        self.after_landing: list = []  # fn(landed keys): run by finish() once the recorder has stopped
        self.cleanups: list = []  # fn(): run by close(), last first
        self.ids = [f"dev-{i:03d}" for i in range(1, devices + 1)]
        # one more device account, never run: the intruder of the foreign-subscriber and takeover scenarios
        self.stack = LocalStack(self.dir / "stack", self.ids + [INTRUDER], **({"limits": limits} if limits else {}))
        if misconfigured:
            self.stack.broker = _acl_file_broker(self.stack)
        self.faults: list[str] = []
        user, password = self.stack.recorder_login
        pw = self.dir / "recorder.pw"
        pw.write_text(password)
        pw.chmod(0o600)
        self.landing = self.dir / "landing"
        self.tmpfs = None
        if tmpfs_landing_mb is not None:  # disk-full: the landing zone on a small disk of the run's own
            self.tmpfs = Tmpfs(self.dir / "disk", tmpfs_landing_mb).mount()
            self.cleanups.append(self.tmpfs.unmount)
            self.landing = self.tmpfs.path / "landing"
        self.recorder = RecorderProcess(
            self.dir / "recorder.log",
            host=self.stack.broker.host,
            port=self.stack.broker.port,
            cafile=self.stack.ca_cert,
            landing=self.landing,
            client_id=RECORDER_CLIENT_ID,
            username=user,
            password_file=pw,
            extra=recorder_args,
        )
        self.vdevs: list[VirtualDevice] = []
        self.fleet = None
        self.t0 = time.monotonic()
        self._log_from = 0  # broker log offset of its latest start

    def _start_broker(self) -> None:
        self._log_from = self.stack.broker.log_size()
        self.stack.broker.start()

    # -- life cycle -----------------------------------------------------------------
    def start(self, run_for_s: float) -> None:
        self._start_broker()
        self.recorder.start()
        if self.kind == "virtual":
            b = self.stack.broker
            self.vdevs = [
                VirtualDevice(
                    b.host,
                    b.port,
                    self.stack.ca_cert,
                    d,
                    self.stack.credentials[d],
                    e2e=self.e2e,
                    resend_after_s=self.resend_after_s,
                )
                for d in self.ids
            ]
        else:
            from mqbatch.lab.devices import Fleet

            if self.sample_hz is not None:
                from mqbatch.scenarios.demo import DEVICE_CONFIG

                cfg = json.loads(json.dumps(DEVICE_CONFIG))
                cfg.update(sample_hz=self.sample_hz, run_for_s=run_for_s, drain_timeout_s=120)
                cfg["e2e_ack"]["enabled"] = self.e2e
            else:
                cfg = {
                    "sample_hz": 50,
                    "run_for_s": run_for_s,
                    "drain_timeout_s": 60,
                    "health_every_s": 1,
                    "flush": {"max_count": 20, "max_age_ms": 200},
                    "backoff": {"initial_ms": 200, "max_ms": 1000},
                }
                cfg["e2e_ack"] = {"enabled": self.e2e, "resend_after_s": max(1, round(self.resend_after_s))}
            b = self.stack.broker
            self.fleet = Fleet(
                self.dir / "devices",
                b.host,
                b.port,
                credentials={d: self.stack.credentials[d] for d in self.ids},
                ca=self.stack.ca_cert,
                config=cfg,
            )
            self.fleet.start()

    def fault(self, text: str) -> None:
        self.faults.append(text)
        self.say(f"  fault: {text}")

    def kill_broker(self) -> None:
        self.stack.broker.kill()
        time.sleep(0.3)
        self._start_broker()
        self.fault("broker SIGKILL + restart")

    def finish(self, timeout: float = 90) -> Result:
        """Stop producing, let the devices drain, stop the recorder, count."""
        deadline = time.monotonic() + timeout
        stats = {}
        if self.kind == "virtual":
            for d in self.vdevs:
                d.stop_producing()
            while not all(d.drained() for d in self.vdevs) and time.monotonic() < deadline:
                time.sleep(0.2)
            stats = {d.id: d.close() for d in self.vdevs}
            stored = set().union(*(d.stored for d in self.vdevs))
            dropped = sum(d.dropped for d in self.vdevs)
        else:
            self.fleet.wait(timeout)
            stored = self.fleet.stored()
            sums = self.fleet.summaries()
            dropped = sum(s.get("dropped_total", 0) for s in sums.values())
            released = sum(s.get("released_unconfirmed", 0) for s in sums.values())
            stats = {
                d: {
                    k: s.get(k)
                    for k in ("dropped_total", "released_unconfirmed", "reconnects", "e2e_resends", "publishes")
                    if k in s
                }
                for d, s in sums.items()
            }
        if not self.recorder.running:
            self.recorder.start()
        self._recorder_caught_up(deadline)
        self.recorder.stop()
        self.stack.broker.stop()
        landed, dups = landed_records(self.landing)
        for step in self.after_landing:
            step(landed)
        return Result(
            "",
            self.kind,
            self.e2e,
            len(self.ids),
            len(stored),
            len(landed & stored),
            dups,
            dropped,
            self.faults,
            stats,
            released if self.kind == "firmware" else 0,
            self.checks,
            self.problems,
        )

    def _recorder_caught_up(self, deadline: float) -> None:
        """Until the broker has had every PUBLISH it sent the recorder (since its latest
        start) acknowledged, and that stayed so for a second; or nothing changed for 3 s
        (an intruder that held the recorder's client id never acknowledged what it got);
        or the deadline."""
        last, same = None, 0
        while time.monotonic() < deadline:
            logs = self.stack.broker.logs(since=self._log_from)
            now = (
                logs.count(f"Sending PUBLISH to {RECORDER_CLIENT_ID} "),
                logs.count(f"Received PUBACK from {RECORDER_CLIENT_ID} "),
            )
            same = same + 1 if now == last else 0
            if (now[0] == now[1] and same >= 1) or same >= 3:
                return
            last = now
            time.sleep(1.0)
        self.say(f"  the recorder had not caught up by the deadline: {last}")

    def close(self) -> None:
        for d in self.vdevs:
            if d._thread.is_alive():
                d.close()
        if self.fleet is not None:
            self.fleet.stop()
        self.recorder.close()
        if self.stack.broker.running:
            self.stack.broker.kill()
        for step in reversed(self.cleanups):
            step()


def _acl_file_broker(stack: LocalStack) -> Mosquitto:
    """The stack's broker as it was before issue 10 (docs/security.md): password_file +
    acl_file instead of the dynamic-security plugin, so any account may SUBSCRIBE to
    anything (read is checked only at delivery) and CONNECT with any client id."""
    opts = stack.policy.broker_options()
    del opts["dynamic_security"]
    users = dict(stack.credentials)
    users[stack.recorder_login[0]] = stack.recorder_login[1]
    acl = (
        f"user {stack.recorder_login[0]}\ntopic read {TELEMETRY_FILTER}\ntopic write {ACK_TOPICS}\n\n"
        "pattern write mqbatch/%u/telemetry\npattern write mqbatch/%u/status\npattern read mqbatch/%u/ack\n"
    )
    return Mosquitto(
        stack.run_dir / "broker-acl-file",
        certfile=stack.pki.server.cert,
        keyfile=stack.pki.server.key,
        cafile=stack.pki.ca_cert,
        persistence=True,
        users=users,
        acl=acl,
        **opts,
    )


def _intruder(h: Harness, client_id: str, *, persistent: bool) -> mqtt.Client:
    """A paho client logged in with the intruder's (device) account; it connects once (no reconnect)."""
    dev = INTRUDER
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, reconnect_on_failure=False)
    c.tls_set(ca_certs=str(h.stack.ca_cert), cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set(dev, h.stack.credentials[dev])
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600 if persistent else 0
    answers = []
    c.on_connect = lambda client, userdata, flags, rc, p: answers.append(f"CONNACK {rc}")
    c.on_subscribe = lambda client, userdata, mid, rcs, p: answers.append(f"SUBACK {rcs[0]}")
    c.connect(h.stack.broker.host, h.stack.broker.port, keepalive=30, clean_start=not persistent, properties=props)
    c.loop_start()
    c.answers = answers
    return c


# -- scenarios: each drives a started Harness for about run_for_s seconds ---------------


def broker_kill_recorder_down(h: Harness, run_for_s: float, rng: random.Random) -> None:
    """The issue's measured case: the recorder stops (SIGTERM), messages queue for its
    persistent session, the broker is SIGKILLed and restarted, the recorder comes back."""
    time.sleep(run_for_s * 0.2)
    h.recorder.stop()
    h.fault("recorder stopped")
    time.sleep(run_for_s * 0.4)
    h.kill_broker()
    time.sleep(0.5)
    h.recorder.start()
    h.fault("recorder restarted")
    time.sleep(run_for_s * 0.4)


def broker_kills(h: Harness, run_for_s: float, rng: random.Random, kills: int = 10) -> None:
    """Broker SIGKILLs at random moments while everything runs."""
    for t in sorted(rng.uniform(0, run_for_s * 0.8) for _ in range(kills)):
        time.sleep(max(0.0, t - (time.monotonic() - h.t0)))
        h.kill_broker()
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))


def recorder_kills(h: Harness, run_for_s: float, rng: random.Random, kills: int = 5) -> None:
    """Recorder SIGKILLs at random moments (some between its fsync and its acks), each restarted."""
    for t in sorted(rng.uniform(0, run_for_s * 0.8) for _ in range(kills)):
        time.sleep(max(0.0, t - (time.monotonic() - h.t0)))
        h.recorder.kill()
        h.recorder.start()
        h.fault("recorder SIGKILL + restart")
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))


def recorder_down(h: Harness, run_for_s: float, rng: random.Random) -> None:
    """The recorder is down for h.outage_s (issue 22: 300 s at the demo's 10 Hz), from 10 %
    of the run; the broker queues for its persistent session meanwhile."""
    time.sleep(run_for_s * 0.1)
    h.recorder.stop()
    h.fault(f"recorder stopped for {h.outage_s:g} s")
    time.sleep(h.outage_s)
    h.recorder.start()
    h.fault("recorder restarted")
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))


def recorder_kills_10s(h: Harness, run_for_s: float, rng: random.Random, kills: int = 5) -> None:
    """Recorder SIGKILLs at random moments, each restarted 10 s later (issue 22: x5 at 100 Hz)."""
    slot = run_for_s * 0.8 / kills
    for k in range(kills):
        time.sleep(max(0.0, k * slot + rng.uniform(0, slot - 10) - (time.monotonic() - h.t0)))
        h.recorder.kill()
        time.sleep(10)
        h.recorder.start()
        h.fault("recorder SIGKILL, restarted after 10 s")
    time.sleep(max(0.0, run_for_s - (time.monotonic() - h.t0)))


def recorder_down_over_queue_limit(h: Harness, run_for_s: float, rng: random.Random) -> None:
    """The recorder is down longer than the broker's queue for it holds (max_queued_messages)."""
    time.sleep(run_for_s * 0.2)
    h.recorder.stop()
    h.fault(f"recorder stopped (broker queue limit {h.stack.policy.limits.max_queued_messages} messages)")
    time.sleep(run_for_s * 0.5)
    h.recorder.start()
    h.fault("recorder restarted")
    time.sleep(run_for_s * 0.3)


def foreign_subscriber(h: Harness, run_for_s: float, rng: random.Random) -> None:
    """Another account joins the recorders' share group for the middle half of the run:
    on a broker with acl_file the SUBSCRIBE is granted, the broker hands it its round-robin
    share, refuses the delivery (no read right) and drops it, PUBACKed to the device."""
    time.sleep(run_for_s * 0.25)
    c = _intruder(h, INTRUDER, persistent=False)
    time.sleep(0.5)
    c.subscribe(h.stack.policy.share_subscription, qos=1)
    time.sleep(run_for_s * 0.5)
    h.fault(f"foreign subscriber in the share group ({', '.join(map(str, c.answers))})")
    c.disconnect()
    c.loop_stop()
    time.sleep(run_for_s * 0.25)


def recorder_takeover(h: Harness, run_for_s: float, rng: random.Random) -> None:
    """Another account CONNECTs with the recorder's client id (Clean Start 0): on a broker
    with acl_file the recorder is kicked off and the intruder holds its session (its
    queued and new messages go to the intruder, which may not read them: dropped) until
    the recorder's reconnect takes it back."""
    time.sleep(run_for_s * 0.25)
    c = _intruder(h, RECORDER_CLIENT_ID, persistent=True)
    time.sleep(run_for_s * 0.5)
    h.fault(f"takeover of the recorder's client id ({', '.join(map(str, c.answers)) or 'no CONNACK'})")
    c.disconnect()
    c.loop_stop()
    time.sleep(run_for_s * 0.25)


# name -> (scenario, broker limits (None: brokerconf's), broker with acl_file instead of the plugin)
SCENARIOS = {
    "broker-kill-recorder-down": (broker_kill_recorder_down, None, False),
    "broker-kills": (broker_kills, None, False),
    "recorder-kills": (recorder_kills, None, False),
    "recorder-down-over-queue-limit": (recorder_down_over_queue_limit, Limits(max_queued_messages=20), False),
    "recorder-down": (recorder_down, None, False),  # h.outage_s
    "recorder-kills-10s": (recorder_kills_10s, None, False),
    "foreign-subscriber-acl-file": (foreign_subscriber, None, True),
    "recorder-takeover-acl-file": (recorder_takeover, None, True),
    "foreign-subscriber": (foreign_subscriber, None, False),
    "recorder-takeover": (recorder_takeover, None, False),
    "disk-full": (disk_full, None, False),  # h.disk_full_s; the landing zone on a tmpfs (root)
    "stream-kills": (stream_kills, None, False),
}
TMPFS_LANDING_MB = {"disk-full": 32}  # scenarios whose landing zone is a small disk of their own
# rolls every 10 s (default 60): the stream gets a new landing file (a micro-batch) every 10 s, and
# the full disk meets rolls into Parquet as well as WAL writes
RECORDER_ARGS = {name: ("--roll-seconds", "10") for name in ("disk-full", "stream-kills")}


def run_scenario(
    name: str,
    run_dir,
    *,
    devices: int = 2,
    kind: str = "virtual",
    e2e: bool = True,
    run_for_s: float = 10.0,
    seed: int | None = None,
    resend_after_s: float = 3.0,
    say=print,
    sample_hz: float | None = None,
    outage_s: float = 300.0,
    disk_full_s: float = 60.0,
    spark_check: bool = False,
) -> Result:
    fn, limits, misconfigured = SCENARIOS[name]
    seed = secrets.randbelow(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    h = Harness(
        pathlib.Path(run_dir),
        devices=devices,
        kind=kind,
        e2e=e2e,
        limits=limits,
        resend_after_s=resend_after_s,
        misconfigured=misconfigured,
        say=say,
        sample_hz=sample_hz,
        outage_s=outage_s,
        disk_full_s=disk_full_s,
        tmpfs_landing_mb=TMPFS_LANDING_MB.get(name),
        recorder_args=RECORDER_ARGS.get(name, ()),
    )
    say(f"{name}: {devices} {kind} devices, e2e {'on' if e2e else 'off'}, {run_for_s:g} s, seed {seed}")
    if spark_check:  # the Spark report's per-device accounting on the run's landing zone
        spark_report_check(h)
    try:
        h.start(run_for_s)
        h.t0 = time.monotonic()
        fn(h, run_for_s, rng)
        result = h.finish()
    finally:
        h.close()
    result.scenario = name
    result.device_stats["seed"] = seed
    (pathlib.Path(run_dir) / "result.json").write_text(json.dumps(dataclasses.asdict(result), indent=1))
    return result
