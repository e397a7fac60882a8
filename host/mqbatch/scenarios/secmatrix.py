"""The authorisation matrix: what each role may do on a broker configured by
mqbatch.fleet.brokerconf, probed for real with paho-mqtt (MQTT 5, TLS).

`run_matrix(stack)` connects as each role, tries each action and returns one
`Row` per (role, action) with the expected and the observed outcome;
`markdown(rows)` renders them for docs/security.md (tools/security_matrix.py
regenerates that section; tests/scenarios/test_security_matrix.py asserts every row).

`Probe` is the small synchronous paho client used for it (and by the tests):
connect, publish QoS 1 and wait for the PUBACK's reason code, subscribe and
wait for the SUBACK's.
"""

from __future__ import annotations

import dataclasses
import ssl
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT = 5.0


def _rc(reason_code) -> str:
    return f"{reason_code.value:#04x} {reason_code}"


class Probe:
    """One paho-mqtt MQTT 5 connection over TLS; every call waits for the broker's answer.

    connack: "0x00 Success" or the refusal ("0x87 Not authorized"); connected: bool."""

    def __init__(
        self,
        host: str,
        port: int,
        cafile,
        client_id: str,
        username: str | None,
        password: str | None,
        clean_start: bool = True,
        session_expiry: int = 0,
        certfile=None,
        keyfile=None,
        on_message=None,
    ):
        self.disconnects: list[str] = []
        self._cond = threading.Condition()
        self._acks: dict[int, object] = {}
        self._connack = None
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        c.tls_set(
            ca_certs=str(cafile),
            certfile=certfile and str(certfile),
            keyfile=keyfile and str(keyfile),
            cert_reqs=ssl.CERT_REQUIRED,
        )
        if username is not None:
            c.username_pw_set(username, password)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_ack
        c.on_subscribe = lambda client, userdata, mid, rcs, props: self._on_ack(client, userdata, mid, rcs[0], props)
        if on_message is not None:  # on_message(mqtt.MQTTMessage), in paho's network thread
            c.on_message = lambda client, userdata, msg: on_message(msg)
        self.client = c
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = session_expiry
        c.connect(host, port, keepalive=30, clean_start=clean_start, properties=props)
        c.loop_start()
        with self._cond:
            self._cond.wait_for(lambda: self._connack is not None or self.disconnects, WAIT)
        self.connack = (
            _rc(self._connack)
            if self._connack is not None
            else (f"closed ({self.disconnects[0]})" if self.disconnects else "no CONNACK")
        )

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        with self._cond:
            self._connack = reason_code
            self._cond.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        with self._cond:
            self.disconnects.append(_rc(reason_code))
            self._cond.notify_all()

    def _on_ack(self, client, userdata, mid, reason_code, properties):
        with self._cond:
            self._acks[mid] = reason_code
            self._cond.notify_all()

    @property
    def connected(self) -> bool:
        return self.client.is_connected()

    def _wait(self, mid: int) -> str:
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._acks or not self.client.is_connected(), WAIT):
                return "no answer"
            if mid not in self._acks:
                return f"connection closed ({self.disconnects[-1] if self.disconnects else '?'})"
            return _rc(self._acks.pop(mid))

    def publish(self, topic: str, payload: bytes = b"x", properties: Properties | None = None) -> str:
        """QoS 1; returns the PUBACK's reason code, e.g. "0x00 Success", "0x87 Not authorized"."""
        if not self.connected:
            return "not connected"
        info = self.client.publish(topic, payload, qos=1, properties=properties)
        return self._wait(info.mid)

    def subscribe(self, topic_filter: str) -> str:
        """QoS 1; returns the SUBACK's reason code, e.g. "0x01 Granted QoS 1"."""
        if not self.connected:
            return "not connected"
        _, mid = self.client.subscribe(topic_filter, qos=1)
        return self._wait(mid)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclasses.dataclass(frozen=True)
class Row:
    role: str
    action: str
    expected: str  # "allowed" or "refused"
    observed: str  # the broker's reason code

    @property
    def outcome(self) -> str:
        return "refused" if _refused(self.observed) else "allowed"

    @property
    def ok(self) -> bool:
        return self.outcome == self.expected


DELIVERED, NOT_DELIVERED = "delivered", f"nothing delivered within {WAIT:g} s"


def _refused(observed: str) -> bool:
    # 0x00 Success, 0x01 Granted QoS 1, 0x10 No matching subscribers are successes; every
    # MQTT 5 reason code >= 0x80 is a refusal, as is a closed connection
    if observed == DELIVERED:
        return False
    try:
        return int(observed.split()[0], 16) >= 0x80
    except ValueError:
        return True


def run_matrix(stack, device: str | None = None, other: str | None = None) -> list[Row]:
    """Probe the stack's broker (mqbatch.lab.stack.LocalStack, started) as a device, a
    recorder, an unknown account and a wrong password (and a device receiving its
    end-to-end ack from a recorder). Returns the rows in order."""
    from mqbatch.lab.stack import RECORDER_CLIENT_ID

    devices = list(stack.credentials)
    device, other = device or devices[0], other or devices[1]
    rec_user, rec_pw = stack.recorder_login
    share = stack.policy.share_subscription
    b = stack.broker
    rows: list[Row] = []

    def probe(client_id, user, password):
        return Probe(b.host, b.port, stack.ca_cert, client_id, user, password)

    def connect_row(role, action, expected, client_id, user, password):
        p = probe(client_id, user, password)
        rows.append(Row(role, action, expected, p.connack))
        p.close()

    roles = (
        ("device", device, stack.credentials[device], device, RECORDER_CLIENT_ID),
        ("recorder", rec_user, rec_pw, RECORDER_CLIENT_ID, device),
    )
    for role, user, pw, own_id, other_id in roles:
        connect_row(role, "connect with its own client id", "allowed", own_id, user, pw)
        connect_row(role, f"connect with another client's id ({other_id})", "refused", other_id, user, pw)
        p = probe(own_id, user, pw)
        try:
            pubs = [
                (
                    f"publish mqbatch/{device}/telemetry (the device's own)",
                    f"mqbatch/{device}/telemetry",
                    "allowed" if role == "device" else "refused",
                ),
                (
                    f"publish mqbatch/{device}/status (the device's status)",
                    f"mqbatch/{device}/status",
                    "allowed" if role == "device" else "refused",
                ),
                (f"publish mqbatch/{other}/telemetry (another device's)", f"mqbatch/{other}/telemetry", "refused"),
                (
                    f"publish mqbatch/{device}/ack (the device's e2e acks)",
                    f"mqbatch/{device}/ack",
                    "allowed" if role == "recorder" else "refused",
                ),
                (
                    f"publish mqbatch/{other}/ack (another device's e2e acks)",
                    f"mqbatch/{other}/ack",
                    "allowed" if role == "recorder" else "refused",
                ),
                ("publish $CONTROL/dynamic-security/v1 (policy admin)", "$CONTROL/dynamic-security/v1", "refused"),
            ]
            for action, topic, expected in pubs:
                rows.append(Row(role, action, expected, p.publish(topic)))
            rows.append(
                Row(
                    role,
                    "still connected after a refused publish",
                    "allowed",
                    "0x00 Success" if p.connected else f"closed ({p.disconnects})",
                )
            )
            subs = [
                (f"subscribe {share} (recorders' share group)", share, "allowed" if role == "recorder" else "refused"),
                (
                    "subscribe $share/another-group/mqbatch/+/telemetry",
                    f"$share/another-group/{stack.policy.topic_filter}",
                    "refused",
                ),
                (f"subscribe mqbatch/{device}/telemetry", f"mqbatch/{device}/telemetry", "refused"),
                (f"subscribe mqbatch/{other}/telemetry", f"mqbatch/{other}/telemetry", "refused"),
                ("subscribe mqbatch/+/telemetry (not shared)", "mqbatch/+/telemetry", "refused"),
                (
                    f"subscribe mqbatch/{device}/ack (the device's e2e acks)",
                    f"mqbatch/{device}/ack",
                    "allowed" if role == "device" else "refused",
                ),
                (f"subscribe mqbatch/{other}/ack (another device's e2e acks)", f"mqbatch/{other}/ack", "refused"),
                ("subscribe mqbatch/+/ack", "mqbatch/+/ack", "refused"),
                ("subscribe #", "#", "refused"),
                ("subscribe $SYS/#", "$SYS/#", "refused"),
            ]
            for action, topic, expected in subs:
                rows.append(Row(role, action, expected, p.subscribe(topic)))
        finally:
            p.close()
    rows.append(
        _ack_delivery(b, stack.ca_cert, device, stack.credentials[device], rec_user, rec_pw, RECORDER_CLIENT_ID)
    )
    connect_row("unknown account", "connect", "refused", "intruder", "intruder", "whatever")
    connect_row("wrong password", f"connect as {device}", "refused", device, device, "not-the-password")
    connect_row("no username", "connect", "refused", "anonymous-1", None, None)
    return rows


def _ack_delivery(b, cafile, device, password, rec_user, rec_pw, rec_client_id) -> Row:
    """The device, subscribed to its ack topic, gets what a recorder publishes there
    (the receive ACL: docs/e2e-ack.md section 4)."""
    from mqbatch.ingest import e2eack

    got = []
    own = e2eack.ack_topic(device)
    d = Probe(b.host, b.port, cafile, device, device, password, on_message=lambda m: got.append(m.topic))
    r = Probe(b.host, b.port, cafile, rec_client_id, rec_user, rec_pw)
    try:
        d.subscribe(own)
        r.publish(own, e2eack.encode([(1, 0, 0)])[0])
        wait_until(lambda: got, WAIT)
        observed = DELIVERED if own in got else NOT_DELIVERED
    finally:
        r.close()
        d.close()
    return Row("device", f"receive what a recorder publishes to {own}", "allowed", observed)


def markdown(rows: list[Row]) -> str:
    """The matrix as a Markdown table (generated: do not edit by hand)."""
    out = ["| role | action | expected | broker's answer | |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r.role} | {r.action.replace('|', '/')} | {r.expected} | {r.observed} | "
            f"{'ok' if r.ok else '**MISMATCH**'} |"
        )
    return "\n".join(out) + "\n"


def wait_until(predicate, timeout: float, step: float = 0.05) -> bool:
    """Poll predicate() until true or timeout; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(step)
    return True
