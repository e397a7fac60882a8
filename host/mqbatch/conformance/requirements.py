"""The requirement rows of `mqbatch conformance`: batch-format v1 (spec §3.1, 3.2, 3.3, 4, 5, 7,
8) and the MQTT 5.0 rules a publisher must obey, each with the OASIS MQTT 5.0 normative
statement ids it checks. One check (one rule id of mqbatch.conformance.session /
batchrules) per requirement; a row whose check is another row's (the batch spec restating
an MQTT rule) names it in `same_as`, so a fault may fail both and no other.
"""

from __future__ import annotations

import dataclasses

from mqbatch.conformance.requirements_mqtt import rows as _mqtt_rows


@dataclasses.dataclass
class Req:
    id: str
    section: str
    level: str
    text: str
    how: str
    check: tuple
    statements: tuple = ()  # OASIS MQTT 5.0 normative statement ids checked ("MQTT-3.3.2-8", ...)
    same_as: str = ""  # the row whose check this row shares (a restated requirement)


MQTT_ROWS = _mqtt_rows(Req)

_VERDICT = ("verdict", "reason", "delivered")
_LOG = ("log", "log client id", "partial warning")
_ALL_ASPECTS = _VERDICT + _LOG
_ALL_ERRORS = ("E1", "E2", "E3", "E4", "E5", "E6")
_SECURITY = (
    "plain-TCP loopback listeners are used so the proxy can read every packet; TLS, certificate "
    "validation, passwords and ACLs are covered by tests/firmware/test_mqtt_client.py, tests/firmware/test_app.py and "
    "the authorisation matrix against the real broker (tests/scenarios/test_security_matrix.py, docs/security.md), "
    "not by this harness"
)

REQUIREMENTS = [
    Req(
        "PUBLISHER-DELIVERS",
        "3.1, 5",
        "MUST",
        "The publisher exits as its command says it should (status 0, by itself) and every record it "
        "reports stored reaches a subscriber.",
        "per scenario: the publisher's exit status, and the distinct sub-messages the witness subscriber "
        "(paho-mqtt on the broker) got against what the publisher reports stored (the firmware's "
        "stored_records; a command's last `MQBATCH-STORED n` line; at least one record either way)",
        ("delivery",),
    ),
    Req(
        "HARNESS",
        "-",
        "MUST (harness)",
        "The inspecting proxy parsed every byte both ways and its checker never failed.",
        "proxy: a checker exception or a packet too large to buffer is reported here, never hidden",
        ("pub", ["HARNESS-ERROR", "HARNESS-LIMIT"]),
    ),
    # 3.1 publisher
    Req(
        "BATCH-3.1-1",
        "3.1",
        "MUST",
        "Set the batch-format User Property to a supported version string (\"v1\").",
        "proxy: every PUBLISH on a batch topic carries batch-format exactly once, value v1",
        ("pub", ["BATCH-FORMAT"]),
    ),
    Req(
        "BATCH-3.1-2",
        "3.1",
        "MUST",
        "Set batch-size to the correct positive integer count, as a UTF-8 string.",
        "proxy: batch-size present once, a positive decimal integer, equal to the sub-messages of a payload "
        "that parses (a payload that does not parse is BATCH-3.1-3's)",
        ("pub", ["BATCH-SIZE", "BATCH-COUNT"]),
    ),
    Req(
        "BATCH-3.1-3",
        "3.1",
        "MUST",
        "Format the Batch Payload per §2.3 (VBI length prefixes).",
        "proxy: the payload parses to its end as minimal VBI-prefixed sub-messages (independent parser); "
        "an empty payload is no batch",
        ("pub", ["BATCH-PAYLOAD"]),
    ),
    Req(
        "BATCH-3.1-4",
        "3.1",
        "MUST",
        "The whole PUBLISH must not exceed the Maximum Packet Size from CONNACK.",
        "proxy: exact size of every packet (Remaining Length bytes included) against CONNACK's Maximum Packet "
        "Size; scenarios max_packet_size 120, 128, 200, 600 (forces splitting) and 2000",
        ("pub", ["MQTT-MAX-PACKET-SIZE"]),
        ("MQTT-3.2.2-15",),
        "MQTT-MAX-PACKET-SIZE",
    ),
    Req(
        "BATCH-3.1-5",
        "3.1",
        "SHOULD",
        "Implement and respect configurable upper limits for batch-size and payload bytes (§3.3).",
        "proxy: every batch within the limits the publisher is configured with (the firmware: "
        "flush.max_count 100, flush.max_bytes 2048; a command: --max-batch-size, --max-payload-bytes; "
        "scenarios limits-10-2048 and limits-100-400); PASS needs a batch exactly on a limit (+1 would fail)",
        ("pub", ["BATCH-LIMITS"]),
    ),
    Req(
        "BATCH-3.1-6",
        "3.1",
        "SHOULD",
        "Validate sub-payload sizes before sending.",
        "not observable on the wire",
        (
            "none",
            "a publisher that validates sends the same bytes as one that does not; the firmware encoder's "
            "refusal of oversized records is tested in tests/mpy/mp_test_codec.py",
        ),
    ),
    # 3.2 subscriber
    Req(
        "BATCH-3.2-1",
        "3.2",
        "MUST",
        "Check presence and value of batch-format.",
        "corpus: missing, duplicated, other-case key, v2, V1",
        ("sub", ["missing-batch-format", "format-v2", "format-V1-uppercase", "key-case-differs"]),
    ),
    Req(
        "BATCH-3.2-2",
        "3.2",
        "MUST",
        "Check presence of batch-size and parse its integer value.",
        "corpus: missing, zero, negative, non-numeric, +2, duplicated, 400 digits",
        (
            "sub",
            [
                "missing-batch-size",
                "batch-size-zero",
                "batch-size-negative",
                "batch-size-not-a-number",
                "batch-size-plus-sign",
                "batch-size-twice",
                "batch-size-huge-number",
            ],
        ),
    ),
    Req(
        "BATCH-3.2-3",
        "3.2",
        "MUST",
        "Parse the Batch Payload per §2.3, decoding VBI lengths.",
        "corpus: the spec example, 1/2/3-byte VBIs, zero-length sub-messages, property order",
        ("sub", ["ok"]),
    ),
    Req(
        "BATCH-3.2-4",
        "3.2",
        "MUST",
        "Perform the validation of §4 and §7.",
        "corpus: all six error classes",
        ("sub", list(_ALL_ERRORS)),
    ),
    Req(
        "BATCH-3.2-5",
        "3.2",
        "MUST",
        "Handle malformed batches per §4.",
        "corpus: every malformed case discarded (or partial when enabled) with its reason",
        ("sub", list(_ALL_ERRORS) + ["partial"]),
    ),
    Req(
        "BATCH-3.2-6",
        "3.2",
        "SHOULD",
        "Implement and respect configurable limits (§3.3).",
        "corpus: limits configured below the defaults",
        ("sub", ["over-configured-batch-size", "over-configured-payload"]),
    ),
    Req(
        "BATCH-3.2-SPARK",
        "3.2, 4",
        "MUST",
        "The Spark job (mqbatch.spark, spark_jobs/telemetry_job.py) as a "
        "subscriber: §3.2, §3.3 and §4 on the same corpus.",
        "the corpus as a real landing zone; the job's decode step per option group (JobOptions): batch_status, "
        "batch-stage reason, sub_payload rows delivered, the quarantine row as the log (topic, batch properties, "
        "reason); run_batch once: no records/ row from a discarded batch (mqbatch.conformance.spark_job)",
        ("spark",),
    ),
    # 3.3
    Req(
        "BATCH-3.3-1",
        "3.3",
        "SHOULD",
        "Publishers and subscribers implement configurable limits; defaults 100 sub-messages, 65536 bytes.",
        "corpus: 100 accepted, 101 and 65537 bytes rejected at the defaults; proxy: "
        "publisher batches within its limits",
        ("sub", ["at-max-batch-size", "over-default-batch-size", "over-default-payload"]),
    ),
    Req(
        "BATCH-3.3-2",
        "3.3",
        "MUST",
        "Adjust the limits to system constraints, network and broker capabilities.",
        "proxy: the publisher's batches follow the broker's Maximum Packet Size (split scenario)",
        ("pub", ["MQTT-MAX-PACKET-SIZE"]),
        ("MQTT-3.2.2-15",),
        "MQTT-MAX-PACKET-SIZE",
    ),
    Req(
        "BATCH-3.3-3",
        "3.3",
        "MUST",
        "Subscribers reject batches over their limits and log e.g. BATCH_SIZE_LIMIT_EXCEEDED.",
        "corpus: over-limit cases discarded with the limit reason, logged",
        ("sub", ["limit"], _ALL_ASPECTS),
    ),
    # 4.1
    *[
        Req(f"BATCH-4.1-{i}", "4.1", "MUST", f"Detect error {i}: {t}.", f"corpus: class E{i}", ("sub", [f"E{i}"]))
        for i, t in enumerate(
            [
                "missing/invalid properties",
                "unsupported format",
                "invalid VBI length",
                "length exceeds payload boundary",
                "incomplete payload data",
                "count mismatch (fewer found or trailing data)",
            ],
            1,
        )
    ],
    # 4.2
    Req(
        "BATCH-4.2-1",
        "4.2",
        "MUST",
        "Errors 1-5: discard the entire batch and process no sub-message.",
        "corpus: no sub-message delivered for any case of E1..E5",
        ("sub", ["E1", "E2", "E3", "E4", "E5"]),
    ),
    Req(
        "BATCH-4.2-2",
        "4.2",
        "MUST",
        "Log an error with topic, properties and a specific reason code.",
        "corpus: the log record of every rejected case names topic, both properties and the reason code",
        ("sub", list(_ALL_ERRORS) + ["limit"], ("log",)),
    ),
    Req(
        "BATCH-4.2-3",
        "4.2",
        "MUST (default)",
        "Count mismatch by default: discard the batch and log an error.",
        "corpus: fewer-found, trailing-data, empty payload discarded",
        ("sub", ["E6"]),
    ),
    Req(
        "BATCH-4.2-4",
        "4.2",
        "MAY / MUST",
        "Optional partial processing of the sub-messages parsed before the "
        "mismatch; if used, log a warning with processed vs expected and the reason.",
        "corpus with partial enabled: only the leading sub-messages, a warning with processed, expected, reason; "
        "errors 1-5 still discard",
        ("sub", ["partial"], _ALL_ASPECTS),
    ),
    Req(
        "BATCH-4.2-5",
        "4.2",
        "MUST",
        "Logs include topic, client id if available, batch properties, error indicator.",
        "corpus: every log record checked for all four",
        ("sub", list(_ALL_ERRORS) + ["limit", "partial"], _LOG),
    ),
    # 5
    Req(
        "BATCH-5-1",
        "5",
        "MUST (broker)",
        "RETAIN=1: the broker stores the whole PUBLISH (payload and all "
        "properties) as the retained message; a zero-byte retained PUBLISH clears it.",
        "broker check: a retained batch published with paho-mqtt reaches a later subscriber byte-identical with "
        "both User Properties; after a zero-byte retained PUBLISH nothing is retained",
        ("broker", "retain"),
    ),
    Req(
        "BATCH-5-2",
        "5",
        "MUST",
        "QoS 1/2 acknowledgements confirm the batch packet by its Packet Identifier.",
        "the acknowledgement flow by packet id: rows MQTT-PACKET-ID, MQTT-RECEIVE-MAX, MQTT-DUP, MQTT-DUP-RESEND, "
        "MQTT-RESEND, MQTT-PUBREL (this row is their summary and fails with any of them)",
        (
            "pub",
            ["MQTT-PID", "MQTT-PID-REUSE", "MQTT-RECEIVE-MAX", "MQTT-DUP", "MQTT-DUP-RESEND", "MQTT-RESEND"]
            + ["MQTT-PUBREL"],
        ),
        (),
        "summary",
    ),
    Req(
        "BATCH-5-3",
        "5",
        "MUST (application)",
        "Applications needing all-or-nothing processing implement their own end-to-end acknowledgement.",
        "an application design choice",
        (
            "none",
            "mqbatch does not claim all-or-nothing processing: the device keeps a batch until the broker "
            "acknowledges it; the recorder lands whole PUBLISHes (docs/ingest.md)",
        ),
    ),
    Req(
        "BATCH-5-4",
        "5",
        "MUST (broker)",
        "Message Expiry Interval applies to the whole batch; the broker discards "
        "it for undelivered subscribers after expiry and forwards the reduced interval.",
        "broker check: a batch with expiry 1 s is not delivered to a persistent subscriber that returns after "
        "2 s; one with expiry 60 s is delivered with an interval <= 60",
        ("broker", "expiry"),
    ),
    # 7
    Req("BATCH-7-1", "7", "MUST", "Clients publishing or subscribing are authenticated.", "-", ("none", _SECURITY)),
    Req("BATCH-7-2", "7", "MUST", "ACLs limit each client to its topics (least privilege).", "-", ("none", _SECURITY)),
    Req("BATCH-7-3", "7", "MUST", "TLS with client and server certificate validation.", "-", ("none", _SECURITY)),
    Req(
        "BATCH-7-4",
        "7",
        "MUST",
        "Subscribers validate structure before processing; parsers fail safely.",
        "corpus: hostile inputs (400-digit batch-size, 5-byte VBIs, garbage) each get a verdict, nothing delivered",
        ("sub", list(_ALL_ERRORS)),
    ),
    Req(
        "BATCH-7-5",
        "7",
        "SHOULD",
        "Applications validate each SubPayload's content.",
        "-",
        (
            "none",
            "application-specific; mqbatch's records are validated by the Spark job (docs/spark.md, "
            "tests/spark/test_spark_job.py), not by this harness",
        ),
    ),
    Req(
        "BATCH-7-6",
        "7",
        "MUST",
        "Limits on batch-size and payload bytes enforced on publisher and subscriber.",
        "proxy: publisher batches within limits; corpus: subscriber rejects over-limit batches",
        ("pub+sub", ["BATCH-LIMITS"], ["limit"]),
        (),
        "BATCH-3.1-5",
    ),
    Req(
        "BATCH-7-7",
        "7",
        "SHOULD (broker)",
        "Brokers rate-limit connections and messages per client.",
        "-",
        (
            "none",
            "Mosquitto 2.0 has no per-client message rate limit; not a property of the publisher or "
            "subscriber under test",
        ),
    ),
    Req(
        "BATCH-7-8",
        "7",
        "MAY",
        "End-to-end payload encryption / HMAC.",
        "-",
        (
            "none",
            "optional (\"consider\"); mqbatch signs each batch with HMAC-SHA256 (User Property batch-hmac, "
            "docs/format.md) and the Spark job verifies it (--hmac-keys); tested by tests/wire/test_integrity.py and "
            "tests/spark/test_spark_hmac.py, not observable by this harness without the device keys",
        ),
    ),
    # 8
    Req(
        "BATCH-8-COMPRESSION",
        "8",
        "SHOULD",
        "A compressed Batch Payload (compressed after the VBI framing) is signalled by the Content Type "
        "property, not a User Property.",
        "proxy: a payload with a gzip/zlib/zstd header or a compression-like User Property must carry a "
        "Content Type naming it, and decompress to a well-formed batch; PASS needs a compressed batch",
        ("pub", ["BATCH-COMPRESSION"]),
    ),
    *MQTT_ROWS,
]
