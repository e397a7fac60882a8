"""A device speaking the end-to-end acknowledgement contract (docs/e2e-ack.md) with
paho-mqtt: the reference peer the recorder's acks are tested against.

    dev = AckingDevice(host, port, cafile, "dev-001", password)     # its own account
    dev.publish_batch(boot=1, first=0, last=99)     # batch-format v1 records + batch-seq "1:0-99"
    dev.wait_acked({(1, s) for s in range(100)}, timeout=10)
    dev.acked                                       # {(boot, seq), ...} covered by the acks received
    dev.ack_messages                                # each ack PUBLISH: (topic, qos, retain, expiry, ranges)

With e2e=False it publishes without batch-seq and does not subscribe (a device with
e2e acks off). It subscribes with QoS 1 after every CONNACK without Session
Present (docs/e2e-ack.md section 3); a bad ack payload is counted in .bad_acks.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch.ingest import e2eack
from mqbatch.scenarios.secmatrix import Probe
from mqbatch.wire import codec, records


@dataclasses.dataclass(frozen=True)
class AckMessage:
    topic: str
    qos: int
    retain: bool
    message_expiry: int | None
    ranges: tuple


def batch(boot: int, first: int, last: int, time_ms: int | None = None) -> tuple[list[tuple[str, str]], bytes]:
    """(user properties without batch-seq, payload) of a batch-format v1 batch of sample
    records (boot, first..last): what the Spark job decodes to (device, boot, seq)."""
    now = time.time_ns() // 1_000_000 if time_ms is None else time_ms
    return codec.encode_batch(
        [records.encode_binary("sample", boot, s, now, [(1, 2000 + s % 1000)]) for s in range(first, last + 1)]
    )


class AckingDevice(Probe):
    def __init__(
        self,
        host: str,
        port: int,
        cafile,
        device_id: str,
        password: str,
        *,
        e2e: bool = True,
        session_expiry: int = 0,
        client_id: str | None = None,
    ):
        self.device_id, self.e2e = device_id, e2e
        self.acked: set[tuple[int, int]] = set()
        self.ack_messages: list[AckMessage] = []
        self.bad_acks = 0
        self._acked_cond = threading.Condition()
        super().__init__(
            host,
            port,
            cafile,
            client_id or device_id,
            device_id,
            password,
            clean_start=session_expiry == 0,
            session_expiry=session_expiry,
            on_message=self._on_ack_msg,
        )
        self.suback = self.subscribe(e2eack.ack_topic(device_id)) if e2e and self.connected else None

    def _on_ack_msg(self, msg) -> None:
        try:
            ranges = e2eack.decode(msg.payload)
        except e2eack.AckError:
            self.bad_acks += 1
            return
        with self._acked_cond:
            self.ack_messages.append(
                AckMessage(
                    msg.topic,
                    msg.qos,
                    bool(msg.retain),
                    getattr(msg.properties, "MessageExpiryInterval", None),
                    tuple(ranges),
                )
            )
            for boot, first, last in ranges:
                self.acked.update((boot, s) for s in range(first, last + 1))
            self._acked_cond.notify_all()

    def publish_batch(self, boot: int, first: int, last: int, seq_value: str | None = None) -> str:
        """Publish records first..last of `boot` as one batch (QoS 1); returns the PUBACK's
        reason code. seq_value overrides the batch-seq property (e.g. an invalid one)."""
        props, payload = batch(boot, first, last)
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = list(props)
        if self.e2e or seq_value is not None:
            p.UserProperty = (e2eack.PROPERTY, seq_value or e2eack.format_batch_seq(boot, first, last))
        return self.publish(f"mqbatch/{self.device_id}/telemetry", payload, properties=p)

    def wait_acked(self, keys: set[tuple[int, int]], timeout: float) -> bool:
        """Until every (boot, seq) of keys is covered by an ack received (or timeout)."""
        with self._acked_cond:
            return self._acked_cond.wait_for(lambda: keys <= self.acked, timeout)

    def settle(self, quiet: float = 1.0) -> int:
        """Wait until no ack arrived for `quiet` seconds; the number of ack PUBLISHes received."""
        n = -1
        while n != len(self.ack_messages):
            n = len(self.ack_messages)
            time.sleep(quiet)
        return n
