"""The publisher scenarios of `mqbatch conformance publisher`: broker limits, network faults
and withheld acknowledgements that drive a publisher to every limit it must respect.

Deterministic, not by timing luck: with `hold_acks` the proxy withholds PUBACK/PUBREC/PUBCOMP
until the publisher has used up the server's Receive Maximum and had a moment to send one
PUBLISH too many (mqbatch.conformance.proxy); `hold_connects_s` lets batches pile up first so
there is something to send; `limits` gives the publisher small batch limits (the firmware's
flush.max_count / flush.max_bytes, a command's MQBATCH_MAX_COUNT / MQBATCH_MAX_BYTES) so its
batches land on them; small Maximum Packet Sizes go down to the smallest that fits one
record plus headers.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Scenario:
    name: str
    what: str  # one line: what it exercises
    broker: dict = dataclasses.field(default_factory=dict)  # mqbatch.lab.broker.Mosquitto options
    qos: int = 1
    faults: list = dataclasses.field(default_factory=list)  # [(seconds after start, action, args)]
    hold_connects_s: float = 0.0  # refuse connects this long first (batches pile up in the outbox)
    hold_acks: bool = False  # withhold acknowledgements until the send quota is used up
    hold_s: float | None = None  # with hold_acks: hold each this long even when the quota is used up
    keepalive_s: int | None = None  # the Keep Alive the publisher is told to use
    max_packet_probe: bool = False  # rewrite each CONNACK's Maximum Packet Size (mqbatch.conformance.probe)
    lose_sessions: bool = False  # reconnects reach the broker with Clean Start 1: Session Present 0
    limits: tuple[int, int] | None = None  # (batch count, payload bytes) the publisher is given here
    ci: bool = False  # part of the short matrix of `make test`
    firmware_fails: str = ""  # a known firmware failure of this scenario (the row still FAILs)


# the firmware's smallest: one 53-byte health record (+1 length byte) and a batch PUBLISH's headers on
# mqbatch/conf-NN/telemetry (fixed header 2, topic 27, packet id 2, properties 36) take 121 bytes; 120 is
# the broker setting the firmware was seen to crash-loop at (it then must refuse or drop, not reboot)
SMALLEST_PACKET = 120

SCENARIOS = [
    Scenario("default", "Mosquitto defaults, QoS 1", ci=True),
    Scenario(
        "max-packet-600-split",
        "max_packet_size 600 learnt after 3 s offline: stored batches are split",
        {"max_packet_size": 600},
        hold_connects_s=3.0,
        ci=True,
    ),
    Scenario("max-packet-2000", "max_packet_size 2000", {"max_packet_size": 2000}),
    Scenario(
        f"max-packet-{SMALLEST_PACKET}",
        f"max_packet_size {SMALLEST_PACKET} after 1.5 s offline: about the smallest that holds one record plus "
        "the PUBLISH headers",
        {"max_packet_size": SMALLEST_PACKET},
        hold_connects_s=1.5,
        firmware_fails="the firmware crash-loops when its 53-byte health record does not fit the batch budget "
        "(a firmware fix by another engineer is in progress)",
    ),
    Scenario(
        "max-packet-128", "max_packet_size 128 after 1.5 s offline", {"max_packet_size": 128}, hold_connects_s=1.5
    ),
    Scenario(
        "max-packet-200", "max_packet_size 200 after 1.5 s offline", {"max_packet_size": 200}, hold_connects_s=1.5
    ),
    Scenario(
        "max-packet-probe",
        "after 2 s offline, one batch per connection; each CONNACK tells Maximum Packet Size P - 1, then P, "
        "for P the largest PUBLISH just seen: a budget 1 byte too large builds P again",
        {"max_packet_size": 300},
        hold_connects_s=2.0,
        max_packet_probe=True,
    ),
    Scenario(
        "limits-10-2048",
        "batch limits 10 sub-messages / 2048 payload bytes after 1.5 s offline: batches land on the count limit",
        limits=(10, 2048),
        hold_connects_s=1.5,
        ci=True,
    ),
    Scenario(
        "limits-100-400",
        "batch limits 100 sub-messages / 400 payload bytes after 1.5 s offline: batches fill the byte limit",
        limits=(100, 400),
        hold_connects_s=1.5,
    ),
    Scenario("alias-0", "max_topic_alias 0: no Topic Alias may be used", {"max_topic_alias": 0}),
    Scenario("alias-2", "max_topic_alias 2", {"max_topic_alias": 2}, ci=True),
    Scenario("alias-10", "max_topic_alias 10", {"max_topic_alias": 10}),
    Scenario(
        "inflight-1",
        "max_inflight_messages 1 (Receive Maximum 1), acknowledgements withheld until the quota is used",
        {"max_inflight_messages": 1},
        hold_connects_s=1.5,
        hold_acks=True,
        ci=True,
    ),
    Scenario(
        "inflight-2",
        "max_inflight_messages 2, acknowledgements withheld",
        {"max_inflight_messages": 2},
        hold_connects_s=1.5,
        hold_acks=True,
    ),
    Scenario(
        "inflight-20",
        "max_inflight_messages 20, acknowledgements withheld",
        {"max_inflight_messages": 20},
        hold_connects_s=1.5,
        hold_acks=True,
    ),
    Scenario(
        "keepalive-1",
        "Keep Alive 1 s, Receive Maximum 1, each acknowledgement withheld 1.7 s: the client must still send "
        "(PINGREQ) while its quota is used up",
        {"max_inflight_messages": 1},
        hold_acks=True,
        hold_s=1.7,
        keepalive_s=1,
    ),
    Scenario("max-qos-0", "max_qos 0, publisher asked for QoS 1: nothing above QoS 0 may be sent", {"max_qos": 0}),
    Scenario("max-qos-1", "max_qos 1, publisher asked for QoS 2", {"max_qos": 1}, qos=2),
    Scenario("retain-unavailable", "retain_available false", {"retain_available": False}),
    Scenario(
        "resume-dup",
        "PUBACK lost with the link twice: session resumed, DUP resends",
        faults=[(1.5, "fault", ("s2c", "PUBACK", "drop")), (3.0, "fault", ("s2c", "PUBACK", "drop"))],
        ci=True,
    ),
    Scenario(
        "resume-order",
        "Receive Maximum 5, acknowledgements withheld, the link lost with several messages open: resend order",
        {"max_inflight_messages": 5},
        hold_connects_s=1.5,
        hold_acks=True,
        faults=[(2.0, "fault", ("s2c", "PUBACK", "drop"))],
    ),
    Scenario(
        "session-lost",
        "PUBACK lost with the link; the reconnect reaches the broker with Clean Start 1, so Session Present 0: "
        "the client must discard its session (no DUP resend) and may publish the records again as new messages",
        faults=[(1.5, "fault", ("s2c", "PUBACK", "drop")), (3.0, "fault", ("s2c", "PUBACK", "drop"))],
        lose_sessions=True,
    ),
    Scenario(
        "qos2-recovery",
        "QoS 2: PUBREC then PUBCOMP lost with the link: DUP PUBLISH, then PUBREL resent",
        qos=2,
        faults=[(1.5, "fault", ("s2c", "PUBREC", "drop")), (3.0, "fault", ("s2c", "PUBCOMP", "drop"))],
        ci=True,
    ),
    Scenario(
        "qos2-live",
        "QoS 2 in a live session, PUBREC/PUBCOMP withheld: PUBREL follows PUBREC",
        {"max_inflight_messages": 3},
        qos=2,
        hold_acks=True,
    ),
    Scenario(
        "cut-mid-publish",
        "link cut in the middle of a PUBLISH, then connects refused for 1 s",
        faults=[
            (1.5, "fault", ("c2s", "PUBLISH", "mid")),
            (1.6, "refuse_connects", (True,)),
            (2.6, "refuse_connects", (False,)),
        ],
    ),
    Scenario(
        "stall",
        "link stalled for 2 s (nothing forwarded), then delayed 50 ms per packet",
        faults=[(1.0, "stall", ()), (3.0, "unstall", ()), (3.0, "delay", (0.05,))],
    ),
]
BY_NAME = {s.name: s for s in SCENARIOS}
