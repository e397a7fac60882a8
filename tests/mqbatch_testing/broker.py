"""pytest fixtures for a real Mosquitto broker and a paho-mqtt reference subscriber.

Registered in tests/conftest.py (`pytest_plugins`). Fixtures:

- `pki` (session): mqbatch.fleet.pki.make_pki() in a temp dir; clients "device-1", "device-2".
- `mosquitto` (function): a factory. ``mosquitto(tls=False, **options)`` starts a
  mqbatch.lab.broker.Mosquitto with those options (tls=True fills certfile/keyfile/cafile
  from `pki`) and returns it; every broker it made is stopped after the test,
  and its log is printed (pytest shows it when the test fails).
- `subscriber` (function): a factory. ``subscriber(broker, "topic/#", **connect)``
  returns a connected, subscribed `Subscriber` (paho-mqtt, MQTT 5), closed after the test.
- `wiretap` (function): a factory. ``wiretap(broker)`` returns a `WireTap`, a TCP relay
  to a plain-TCP broker that records every MQTT packet in both directions.

`run_drive(plan, workdir)` runs the device client (tests/mpy/mqtt_drive.py) in the
MicroPython Unix port and returns its JSON events.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.fleet.pki import make_pki
from mqbatch.lab.broker import Mosquitto
from mqbatch.util.paths import FIRMWARE, mpy_cross_exe
from mqbatch_testing import MICROPYTHON, MPY_TESTS, mpy_env


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), clients=["device-1", "device-2", "reader"])


@pytest.fixture
def mosquitto(tmp_path, pki):
    made: list[Mosquitto] = []
    counter = itertools.count(1)

    def factory(tls: bool = False, start: bool = True, **options) -> Mosquitto:
        if tls:
            options.setdefault("certfile", pki.server.cert)
            options.setdefault("keyfile", pki.server.key)
            options.setdefault("cafile", pki.ca_cert)
        broker = Mosquitto(tmp_path / f"broker-{next(counter)}", **options)
        made.append(broker)
        if start:
            broker.start()
        return broker

    yield factory
    for broker in made:
        broker.stop()
        print(f"--- {broker!r} log (tail) ---")
        print(broker.logs()[-4000:])


@dataclass
class Received:
    """One PUBLISH as delivered to the reference subscriber."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    message_expiry: int | None = None
    content_type: str | None = None
    payload_format: int | None = None


class Subscriber:
    """paho-mqtt 2.x MQTT 5 client that records everything it receives.

    persistent=True: Clean Start 0 on every connect (also the first: Mosquitto 2.0
    writes to disk only the sessions of clients whose CONNECT had Clean Start 0) and
    Session Expiry 600 s, with quick automatic reconnects, so that what is published
    while it is away (a broker restart, a network cut) is queued for it: the witness
    of "nothing lost" across outages."""

    def __init__(
        self,
        broker: Mosquitto,
        topic: str,
        qos: int = 1,
        *,
        client_id: str = "ref-subscriber",
        username: str | None = None,
        password: str | None = None,
        cafile=None,
        certfile=None,
        keyfile=None,
        timeout: float = 10.0,
        persistent: bool = False,
    ):
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.connack: tuple | None = None
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if broker.tls:
            c.tls_set(
                ca_certs=str(cafile),
                certfile=certfile and str(certfile),
                keyfile=keyfile and str(keyfile),
                cert_reqs=ssl.CERT_REQUIRED,
            )
        if username is not None:
            c.username_pw_set(username, password)
        c.on_connect = self._on_connect
        c.on_subscribe = lambda client, userdata, mid, reason_codes, props: self._subscribed.set()
        c.on_message = self._on_message
        self._topic, self._qos = topic, qos
        self.client = c
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600 if persistent else 0
        if persistent:
            c.reconnect_delay_set(0.2, 1)
        c.connect(
            broker.host, broker.port, keepalive=5 if persistent else 30, clean_start=not persistent, properties=props
        )
        c.loop_start()
        if not self._subscribed.wait(timeout):
            c.loop_stop()
            raise AssertionError(
                f"reference subscriber could not connect/subscribe to {broker.url}: connack={self.connack}"
            )

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connack = (reason_code, properties)
        # Mosquitto 2.0.11 restores a persisted session after a restart without its shared
        # ($share/...) subscriptions: subscribe again (mqbatch.ingest.recorder does so on every connect)
        if not reason_code.is_failure and (not flags.session_present or self._topic.startswith("$share/")):
            client.subscribe(self._topic, qos=self._qos)
        elif flags.session_present:
            self._subscribed.set()  # the subscription is part of the resumed session

    def _on_message(self, client, userdata, msg):
        p = msg.properties
        rec = Received(
            msg.topic,
            bytes(msg.payload),
            msg.qos,
            bool(msg.retain),
            list(getattr(p, "UserProperty", []) or []),
            getattr(p, "MessageExpiryInterval", None),
            getattr(p, "ContentType", None),
            getattr(p, "PayloadFormatIndicator", None),
        )
        with self._cond:
            self.messages.append(rec)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Received]:
        """Wait until at least `count` messages arrived; return all received so far."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return list(self.messages)

    def settle(self, quiet: float = 0.5, timeout: float = 10.0) -> list[Received]:
        """Wait until nothing new arrived for `quiet` seconds; return all messages."""
        deadline = time.monotonic() + timeout
        n = -1
        while time.monotonic() < deadline:
            with self._cond:
                if len(self.messages) == n:
                    break
                n = len(self.messages)
            time.sleep(quiet)
        with self._cond:
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscriber(pki):
    made: list[Subscriber] = []

    def factory(broker: Mosquitto, topic: str = "#", qos: int = 1, **kw) -> Subscriber:
        if broker.tls:
            kw.setdefault("cafile", pki.ca_cert)
        s = Subscriber(broker, topic, qos, client_id=kw.pop("client_id", f"ref-sub-{len(made)}"), **kw)
        made.append(s)
        return s

    yield factory
    for s in made:
        s.close()


# -- device client driver and wire tap --------------------------------------------

DRIVE = MPY_TESTS / "mqtt_drive.py"


def compile_mpy(dest, *mpy_cross_args: str) -> pathlib.Path:
    """Precompile the client's modules and the test scripts (mqtt_drive, mqtt_heap) to
    .mpy with mpy-cross, as they are deployed on a board (compiling source at import
    needs far more RAM than a small heap has). Returns `dest`, for MICROPYPATH."""
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    sources = [
        FIRMWARE / f"{m}.py"
        for m in ("mqb_codec", "mqb_packet", "mqb_packet_build", "mqb_transport", "mqb_inflight", "mqb_client")
    ]
    for src in sources + [DRIVE, MPY_TESTS / "mqtt_heap.py"]:
        subprocess.run(
            [str(mpy_cross_exe()), *mpy_cross_args, "-o", str(dest / (src.stem + ".mpy")), str(src)],
            check=True,
            capture_output=True,
            text=True,
        )
    return dest


def run_drive(
    plan: dict,
    workdir,
    timeout: float = 120,
    heapsize: str | None = None,
    wrapper: list[str] | None = None,
    on_event=None,
    compiled=None,
) -> list[dict]:
    """Run tests/mpy/mqtt_drive.py (firmware/mqb_client.py in the Unix port) with `plan`;
    return its JSON events. on_event(event) is called as each event arrives (e.g. to
    suspend the broker at a "mark"). compiled: a compile_mpy() directory to run the
    .mpy modules from. Fails with the output if the driver crashed (no final "done" event)."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path = workdir / f"plan-{next(_plans)}.json"
    plan_path.write_text(json.dumps(plan))
    script = ["-m", "mqtt_drive"] if compiled else [str(DRIVE)]
    cmd = (
        (wrapper or [])
        + [str(MICROPYTHON)]
        + (["-X", f"heapsize={heapsize}"] if heapsize else [])
        + [*script, str(plan_path)]
    )
    env = mpy_env(*([compiled] if compiled else []))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    events, lines = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("{"):
                ev = json.loads(line)
                events.append(ev)
                if on_event is not None:
                    on_event(ev)
        err = proc.stderr.read()
        proc.wait()
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not events or events[-1]["event"] != "done":
        raise AssertionError(f"mqtt_drive crashed or timed out (exit {proc.returncode}):\n{''.join(lines)}\n{err}")
    return events


_plans = itertools.count(1)


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


@dataclass
class Frame:
    """One MQTT packet seen by the WireTap."""

    conn: int  # connection number, from 0
    direction: str  # "c2s" (client to broker) or "s2c"
    raw: bytes  # the whole packet: fixed header, Remaining Length, body

    @property
    def type(self) -> int:
        return self.raw[0] >> 4

    @property
    def flags(self) -> int:
        return self.raw[0] & 0x0F

    def body_start(self) -> int:
        i = 1
        while self.raw[i] & 0x80:
            i += 1
        return i + 1

    def publish_fields(self) -> dict:
        """Topic, packet id and properties of a PUBLISH (independent decoder)."""
        b = self.raw
        p = self.body_start()
        tlen = int.from_bytes(b[p : p + 2], "big")
        topic = b[p + 2 : p + 2 + tlen]
        p += 2 + tlen
        pid = None
        if self.flags & 0x06:
            pid = int.from_bytes(b[p : p + 2], "big")
            p += 2
        plen, n = _vbi(b, p)
        p += n
        end = p + plen
        props: dict = {"user": []}
        while p < end:
            k = b[p]
            p += 1
            if k == 0x26:
                kl = int.from_bytes(b[p : p + 2], "big")
                key = b[p + 2 : p + 2 + kl].decode()
                p += 2 + kl
                vl = int.from_bytes(b[p : p + 2], "big")
                props["user"].append((key, b[p + 2 : p + 2 + vl].decode()))
                p += 2 + vl
            elif k in (0x01,):
                props[k] = b[p]
                p += 1
            elif k == 0x02:
                props[k] = int.from_bytes(b[p : p + 4], "big")
                p += 4
            elif k == 0x23:
                props[k] = int.from_bytes(b[p : p + 2], "big")
                p += 2
            elif k == 0x03:
                cl = int.from_bytes(b[p : p + 2], "big")
                props[k] = b[p + 2 : p + 2 + cl].decode()
                p += 2 + cl
            else:
                raise AssertionError(f"unexpected PUBLISH property 0x{k:02x}")
        return {
            "topic": topic.decode(),
            "pid": pid,
            "props": props,
            "payload": b[end:],
            "dup": bool(self.flags & 8),
            "qos": (self.flags >> 1) & 3,
            "retain": bool(self.flags & 1),
        }


def _vbi(b: bytes, p: int) -> tuple[int, int]:
    v = shift = n = 0
    while True:
        c = b[p + n]
        v |= (c & 0x7F) << shift
        n += 1
        if not c & 0x80:
            return v, n
        shift += 7


class WireTap:
    """A TCP relay in front of a (plain TCP) broker that records every MQTT packet
    in both directions, byte for byte: exact packet sizes, flags and properties as
    they were on the wire, independent of what either end reports."""

    def __init__(self, target_host: str, target_port: int, hold_acks_until_open: int = 0, hold_s: float = 1.0):
        """hold_acks_until_open=N: the broker's PUBACK and PUBCOMP (the acks that end a
        PUBLISH's flight) are held, recorded and forwarded only once N of the client's QoS>0
        PUBLISHes are open on the wire, or after waiting hold_s. Without it the packets of
        the two directions are recorded by two threads, so an ack may be recorded before a
        PUBLISH the client sent earlier: the overlap a window of N allows shows on the wire
        only if the client fills it before its first ack comes back (it is not delayed for
        a client that does not: each of that client's acks waits up to hold_s, one after
        the other, and the overlap stays 1)."""
        self.target = (target_host, target_port)
        self.hold_until, self.hold_s = hold_acks_until_open, hold_s
        self._open: dict[int, set] = {}  # per connection: packet ids of QoS>0 PUBLISHes without final ack
        self._open_changed = threading.Condition()
        self.frames: list[Frame] = []
        self.refused: list[str] = []  # upstream connects that failed
        self._lock = threading.Lock()
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(8)
        self.host, self.port = self._srv.getsockname()
        self._conns = itertools.count()
        self._socks: list[socket.socket] = []
        self._c2s_pumps: list[threading.Thread] = []
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(self.target)
            except OSError as e:  # broker down (e.g. restarting): the client sees the connection close
                self.refused.append(str(e))
                c.close()
                continue
            n = next(self._conns)
            self._socks += [c, s]
            c2s = threading.Thread(target=self._pump, args=(c, s, n, "c2s"), daemon=True)
            self._c2s_pumps.append(c2s)
            c2s.start()
            threading.Thread(target=self._pump, args=(s, c, n, "s2c"), daemon=True).start()

    def closed(self, timeout: float = 5.0) -> "WireTap":
        """Wait until every client has closed its connection and everything it sent is
        recorded (a client that just exited: its last packets may still be in flight
        through the tap); returns self."""
        deadline = time.monotonic() + timeout
        for t in list(self._c2s_pumps):
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), f"a client connection through the tap is still open after {timeout} s"
        return self

    def _pump(self, src, dst, conn, direction):
        pending = b""
        one_by_one = bool(self.hold_until) and direction == "s2c"  # a held ack must not let later bytes pass
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # the other pump already closed it
                return
            pending += data
            while len(pending) >= 2:
                try:
                    rem, n = _vbi(pending, 1)
                except IndexError:
                    break
                total = 1 + n + rem
                if len(pending) < total:
                    break
                frame = Frame(conn, direction, pending[:total])
                if not (self.hold_until and self._track(frame)):  # _track may wait (s2c acks) and records
                    with self._lock:
                        self.frames.append(frame)
                pending = pending[total:]
                if one_by_one:
                    try:
                        dst.sendall(frame.raw)
                    except OSError:
                        return
            if one_by_one:
                continue  # its whole frames went one by one; a partial one waits in `pending` for its rest
            try:
                dst.sendall(data)
            except OSError:
                return

    def _track(self, frame: Frame) -> bool:
        """hold_acks_until_open: count the open PUBLISHes; hold a final ack until enough are open.
        Records the frames it counts itself, in the same critical section as the count (a
        PUBLISH counted, then an ack released and recorded before the PUBLISH, would show
        a smaller overlap than there was). True if it recorded the frame."""
        opened = self._open.setdefault(frame.conn, set())
        if frame.direction == "c2s" and frame.type == PacketTypes.PUBLISH and frame.flags & 0x06:
            with self._open_changed:
                opened.add(frame.publish_fields()["pid"])
                with self._lock:
                    self.frames.append(frame)
                self._open_changed.notify_all()
            return True
        if frame.direction == "s2c" and frame.type in (PacketTypes.PUBACK, PacketTypes.PUBCOMP):
            with self._open_changed:
                self._open_changed.wait_for(lambda: len(opened) >= self.hold_until, self.hold_s)
                opened.discard(int.from_bytes(frame.raw[2:4], "big"))
                with self._lock:
                    self.frames.append(frame)
            return True
        return False

    def packets(self, ptype: int | None = None, direction: str | None = None) -> list[Frame]:
        with self._lock:
            return [
                f
                for f in self.frames
                if (ptype is None or f.type == ptype) and (direction is None or f.direction == direction)
            ]

    def close(self):
        self._srv.close()
        for s in self._socks:
            s.close()


@pytest.fixture
def wiretap():
    made: list[WireTap] = []

    def factory(broker: Mosquitto, **kw) -> WireTap:
        t = WireTap(broker.host, broker.port, **kw)
        made.append(t)
        return t

    yield factory
    for t in made:
        t.close()


# -- the secured local stack (mqbatch.lab.stack, policy of mqbatch.fleet.brokerconf) -----------


@pytest.fixture
def secure_stack(tmp_path):
    """A factory: ``secure_stack(["dev-001", "dev-002"], limits=...)`` builds a
    mqbatch.lab.stack.LocalStack with those devices, starts its broker and returns it;
    stopped after the test (its log tail printed)."""
    from mqbatch.lab.stack import LocalStack

    made = []

    def factory(devices, **kw) -> LocalStack:
        stack = LocalStack(tmp_path / f"stack-{len(made) + 1}", list(devices), **kw)
        made.append(stack)
        stack.broker.start()
        return stack

    yield factory
    for stack in made:
        stack.broker.stop()
        print(f"--- {stack.broker!r} log (tail) ---")
        print(stack.broker.logs()[-3000:])


class RecorderThread:
    """mqbatch.ingest.recorder.Recorder running in this process (a thread), its output in .out."""

    def __init__(self, cfg):
        import io

        from mqbatch.ingest.recorder import Recorder

        self.out = io.StringIO()
        self.recorder = Recorder(cfg, out=self.out)
        self._stop = threading.Event()
        self.status = None
        self._thread = threading.Thread(target=self._run, name=f"recorder-{cfg.client_id}", daemon=True)

    def _run(self):
        self.status = self.recorder.run(self._stop)

    def start(self, timeout: float = 15.0) -> "RecorderThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while "subscribed $share/" not in self.out.getvalue():
            assert self._thread.is_alive() and time.monotonic() < deadline, (
                f"recorder did not subscribe:\n{self.out.getvalue()}"
            )
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"recorder did not stop within {timeout} s:\n{self.out.getvalue()}"
        return self.status


@pytest.fixture
def stack_recorder(tmp_path):
    """A factory: ``stack_recorder(stack, landing_dir)`` starts the real recorder
    (in-process) with the stack's recorder account; stopped after the test."""
    from mqbatch.ingest.recorder import RecorderConfig
    from mqbatch.lab.stack import RECORDER_CLIENT_ID

    made = []

    def factory(stack, landing_dir, **cfg) -> RecorderThread:
        cfg.setdefault("client_id", RECORDER_CLIENT_ID)
        user, password = stack.recorder_logins[cfg["client_id"]]
        rec = RecorderThread(
            RecorderConfig(
                host=stack.broker.host,
                port=stack.broker.port,
                landing=str(landing_dir),
                cafile=str(stack.ca_cert),
                username=user,
                password=password,
                progress_seconds=3600,
                **cfg,
            )
        )
        made.append(rec)
        return rec.start()

    yield factory
    for rec in made:
        if rec._thread.is_alive():
            rec.stop()
