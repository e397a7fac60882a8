"""pytest fixtures for a real Mosquitto broker and a paho-mqtt reference subscriber.

Registered in tests/conftest.py (`pytest_plugins`). Fixtures:

- `pki` (session): mqbatch.pki.make_pki() in a temp dir; clients "device-1", "device-2".
- `mosquitto` (function): a factory. ``mosquitto(tls=False, **options)`` starts a
  mqbatch.broker.Mosquitto with those options (tls=True fills certfile/keyfile/cafile
  from `pki`) and returns it; every broker it made is stopped after the test,
  and its log is printed (pytest shows it when the test fails).
- `subscriber` (function): a factory. ``subscriber(broker, "topic/#", **connect)``
  returns a connected, subscribed `Subscriber` (paho-mqtt, MQTT 5), closed after the test.
"""
from __future__ import annotations

import itertools
import ssl
import threading
import time
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

from mqbatch.broker import Mosquitto
from mqbatch.pki import make_pki


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
    """paho-mqtt 2.x MQTT 5 client that records everything it receives."""

    def __init__(self, broker: Mosquitto, topic: str, qos: int = 1, *, client_id: str = "ref-subscriber",
                 username: str | None = None, password: str | None = None,
                 cafile=None, certfile=None, keyfile=None, timeout: float = 10.0):
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.connack: tuple | None = None
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if broker.tls:
            c.tls_set(ca_certs=str(cafile), certfile=certfile and str(certfile), keyfile=keyfile and str(keyfile),
                      cert_reqs=ssl.CERT_REQUIRED)
        if username is not None:
            c.username_pw_set(username, password)
        c.on_connect = self._on_connect
        c.on_subscribe = lambda client, userdata, mid, reason_codes, props: self._subscribed.set()
        c.on_message = self._on_message
        self._topic, self._qos = topic, qos
        self.client = c
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0
        c.connect(broker.host, broker.port, keepalive=30, clean_start=True, properties=props)
        c.loop_start()
        if not self._subscribed.wait(timeout):
            c.loop_stop()
            raise AssertionError(f"reference subscriber could not connect/subscribe to {broker.url}: connack={self.connack}")

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connack = (reason_code, properties)
        if not reason_code.is_failure:
            client.subscribe(self._topic, qos=self._qos)

    def _on_message(self, client, userdata, msg):
        p = msg.properties
        rec = Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain),
                       list(getattr(p, "UserProperty", []) or []),
                       getattr(p, "MessageExpiryInterval", None), getattr(p, "ContentType", None),
                       getattr(p, "PayloadFormatIndicator", None))
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
