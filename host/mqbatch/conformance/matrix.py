"""The requirement matrix of batch-format v1 (spec §3.1, 3.2, 3.3, 4, 5, 7) and the
MQTT 5.0 rules a publisher must obey; verdicts from the evidence of a run.

Each requirement: id, spec section, level (MUST/SHOULD/MAY), text, how it is checked
and a `check` naming the evidence: ("pub", rules) for rules the proxy checks on the
publisher's packets, ("sub", case classes or names) for the subscriber corpus,
("broker", name) for a check of the broker with reference clients, ("spark",) for the
Spark job run through the corpus (mqbatch.conformance.spark_job), or ("none", reason) for
NOT TESTED with its reason. A corpus aspect that does not apply to a subscriber
(passed None, e.g. the client id the Spark job can never see) is neither a pass nor a
fail: the evidence lists it with its reason.

PASS: evidence exists and nothing failed; FAIL: a violation or a failed case, with
the evidence; NOT TESTED: no evidence in this run (the reason says why).
"""

from __future__ import annotations

import dataclasses
import json

PASS, FAIL, NOT_TESTED = "PASS", "FAIL", "NOT TESTED"


@dataclasses.dataclass
class Req:
    id: str
    section: str
    level: str
    text: str
    how: str
    check: tuple


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
        "proxy: batch-size present once, a positive decimal integer, equal to the sub-messages in the payload",
        ("pub", ["BATCH-SIZE", "BATCH-COUNT"]),
    ),
    Req(
        "BATCH-3.1-3",
        "3.1",
        "MUST",
        "Format the Batch Payload per §2.3 (VBI length prefixes).",
        "proxy: the payload parses to its end as minimal VBI-prefixed sub-messages (independent parser)",
        ("pub", ["BATCH-COUNT"]),
    ),
    Req(
        "BATCH-3.1-4",
        "3.1",
        "MUST",
        "The whole PUBLISH must not exceed the Maximum Packet Size from CONNACK.",
        "proxy: exact size of every packet (Remaining Length bytes included) against CONNACK's Maximum Packet "
        "Size; scenarios max_packet_size 600 (forces splitting) and 2000",
        ("pub", ["MQTT-MAX-PACKET-SIZE"]),
    ),
    Req(
        "BATCH-3.1-5",
        "3.1",
        "SHOULD",
        "Implement and respect configurable upper limits for batch-size and payload bytes (§3.3).",
        "proxy: every batch within the limits the publisher is configured with (the firmware: "
        "flush.max_count 100, flush.max_bytes 2048; a command: --max-batch-size, --max-payload-bytes)",
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
        "proxy: ids non-zero, never reused while open, in-flight within Receive Maximum, resends only after a "
        "resume (scenarios resume-dup, qos2-recovery, inflight-1/2/20)",
        ("pub", ["MQTT-PID", "MQTT-PID-REUSE", "MQTT-RECEIVE-MAX", "MQTT-DUP", "MQTT-RESEND"]),
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
    # MQTT 5.0 rules for a publisher
    Req(
        "MQTT-FIXED-HEADER",
        "MQTT 2.1",
        "MUST",
        "Well-formed fixed header: packet type, reserved flags, no QoS 3, no DUP on QoS 0.",
        "proxy, every packet",
        ("pub", ["MQTT-FIXED-HEADER"]),
    ),
    Req(
        "MQTT-REMAINING-LENGTH",
        "MQTT 2.1.4, 1.5.5",
        "MUST",
        "Remaining Length and every VBI minimally encoded, at most 4 bytes; the Remaining Length matches the packet.",
        "proxy, every packet",
        ("pub", ["MQTT-VBI", "MQTT-MALFORMED"]),
    ),
    Req(
        "MQTT-UTF8",
        "MQTT 1.5.4",
        "MUST",
        "UTF-8 strings valid, without U+0000.",
        "proxy, every string field",
        ("pub", ["MQTT-UTF8"]),
    ),
    Req(
        "MQTT-PROPERTIES",
        "MQTT 2.2.2",
        "MUST",
        "Only the properties allowed for the packet type; single-valued properties at most once.",
        "proxy, every property",
        ("pub", ["MQTT-PROP-ALLOWED", "MQTT-PROP-REPEAT"]),
    ),
    Req(
        "MQTT-PACKET-ID",
        "MQTT 2.2.1",
        "MUST",
        "Packet Identifier non-zero, present only at QoS > 0, not reused while unacknowledged.",
        "proxy",
        ("pub", ["MQTT-PID", "MQTT-PID-REUSE"]),
    ),
    Req(
        "MQTT-MAX-PACKET-SIZE",
        "MQTT 3.2.2.3.6",
        "MUST",
        "No packet above the server's Maximum Packet Size.",
        "proxy, exact size",
        ("pub", ["MQTT-MAX-PACKET-SIZE"]),
    ),
    Req(
        "MQTT-TOPIC-ALIAS",
        "MQTT 3.3.2.3.4",
        "MUST",
        "Topic Alias never 0, never above the server's Topic Alias "
        "Maximum (0: none), never used before defined on this connection.",
        "proxy; scenarios max_topic_alias 0, 2, 10",
        ("pub", ["MQTT-TOPIC-ALIAS"]),
    ),
    Req(
        "MQTT-RECEIVE-MAX",
        "MQTT 4.9",
        "MUST",
        "Unacknowledged QoS 1/2 PUBLISHes never above the server's Receive Maximum.",
        "proxy; scenarios max_inflight_messages 1, 2, 20 after 1.5 s offline",
        ("pub", ["MQTT-RECEIVE-MAX"]),
    ),
    Req(
        "MQTT-DUP",
        "MQTT 3.3.1.1, 4.4",
        "MUST",
        "DUP=1 only on the resend of a message left unacknowledged, after a "
        "Session Present resume; open messages and PUBRELs are resent.",
        "proxy; scenarios resume-dup, qos2-recovery",
        ("pub", ["MQTT-DUP", "MQTT-RESEND"]),
    ),
    Req(
        "MQTT-MAX-QOS",
        "MQTT 3.2.2.3.4",
        "MUST",
        "No PUBLISH above the server's Maximum QoS.",
        "proxy; scenarios max_qos 0 and 1",
        ("pub", ["MQTT-MAX-QOS"]),
    ),
    Req(
        "MQTT-RETAIN",
        "MQTT 3.2.2.3.5",
        "MUST",
        "No RETAIN=1 when the server has Retain Available 0.",
        "proxy; scenario retain_available false",
        ("pub", ["MQTT-RETAIN"]),
    ),
    Req(
        "MQTT-AFTER-DISCONNECT",
        "MQTT 3.14.4",
        "MUST",
        "Nothing sent after the client's DISCONNECT.",
        "proxy",
        ("pub", ["MQTT-AFTER-DISCONNECT"]),
    ),
]

# rule -> the name the session checker counts as "exercised" (conformance_session.Checker.applied)
_APPLIED = {
    "BATCH-FORMAT": "BATCH",
    "BATCH-SIZE": "BATCH",
    "BATCH-COUNT": "BATCH",
    "BATCH-LIMITS": "BATCH",
    "MQTT-FIXED-HEADER": "MQTT-PACKET",
    "MQTT-VBI": "MQTT-PACKET",
    "MQTT-MALFORMED": "MQTT-PACKET",
    "MQTT-UTF8": "MQTT-PACKET",
    "MQTT-PROP-ALLOWED": "MQTT-PACKET",
    "MQTT-PROP-REPEAT": "MQTT-PACKET",
    "MQTT-PID": "MQTT-PID-REUSE",
}


def _pub_verdict(rules: list[str], pub: dict | None) -> tuple[str, str]:
    if not pub:
        return NOT_TESTED, "publisher suite not run"
    bad, used = [], []
    for sc in pub["scenarios"]:
        vs = [v for v in sc["violations"] if v["direction"] == "c2s" and v["rule"] in rules]
        if vs:
            ex = next((t for t in sc["violation_traces"] if t.startswith(f"[{vs[0]['rule']}]")), "")
            bad.append(f"{sc['scenario']}: {len(vs)} x {vs[0]['rule']}: {vs[0]['text']}\n{ex}")
        n = sum(sc["applied"].get(f"c2s {a}", 0) for a in {_APPLIED.get(r, r) for r in rules})
        if n:
            used.append(f"{sc['scenario']} ({n})")
    if bad:
        return FAIL, "\n".join(bad)
    if not used:
        idle = [
            f"{sc['scenario']}: no PUBLISH sent, CONNACK codes {sc.get('connack_codes')}"
            for sc in pub["scenarios"]
            if not sc["packets"].get("c2s PUBLISH")
        ]
        return NOT_TESTED, "no scenario of this run exercised it" + ("".join(f"\n{x}" for x in idle))
    return PASS, "0 violations; checked in " + ", ".join(used) + " (packets, or sessions under the limit)"


def _sub_verdict(sel: list[str], sub: list | None, aspects=_VERDICT) -> tuple[str, str]:
    if not sub:
        return NOT_TESTED, "subscriber suite not run"
    cases = [
        c
        for c in sub
        if (c["case"] in sel or c["class"] in sel)
        and any(x["aspect"] in aspects and x["passed"] is not None for x in c["checks"])
    ]
    if not cases:
        return NOT_TESTED, "no corpus case selected"
    failed = [(c, [x for x in c["checks"] if x["aspect"] in aspects and x["passed"] is False]) for c in cases]
    failed = [(c, xs) for c, xs in failed if xs]
    if failed:
        return FAIL, "\n".join(f"{c['case']}: " + "; ".join(x["evidence"] for x in xs) for c, xs in failed[:6]) + (
            f"\n(+{len(failed) - 6} more)" if len(failed) > 6 else ""
        )
    return PASS, f"{len(cases)} cases: " + ", ".join(
        f"{c['case']} -> {c['expect'][0]} {c['expect'][1] or ''}".strip() for c in cases[:8]
    ) + (" ..." if len(cases) > 8 else "")


def _not_applicable(cases: list) -> list[str]:
    """'aspect (N cases): reason' for each aspect reported as not applicable."""
    seen: dict[tuple[str, str], int] = {}
    for c in cases:
        for x in c["checks"]:
            if x["passed"] is None:
                seen[(x["aspect"], x["evidence"])] = seen.get((x["aspect"], x["evidence"]), 0) + 1
    return [f"{a} ({n} cases): {e}" for (a, e), n in seen.items()]


def _spark_verdict(spark: dict | None) -> tuple[str, str]:
    if not spark:
        return NOT_TESTED, (
            "Spark job not run in this invocation (it needs a local Spark session): "
            "`mqbatch conformance subscriber --spark`; tests/conformance/test_conformance_spark.py in `make test`"
        )
    cases, rc = spark["cases"], spark["records_check"]
    failed = [c for c in cases if not c["passed"]]
    lines = [f"{c['case']}: " + "; ".join(x["evidence"] for x in c["checks"] if x["passed"] is False) for c in failed]
    summary = [
        f"{len(cases) - len(failed)} of {len(cases)} corpus cases pass (verdict, reason, delivered, log"
        f"{', partial warning' if any(c['class'] == 'partial' for c in cases) else ''})",
        f"records/: {'PASS' if rc['passed'] else 'FAIL'}: {rc['evidence']}",
        *_not_applicable(cases),
    ]
    return (FAIL if failed or not rc["passed"] else PASS), "\n".join(lines + summary)


def verdicts(pub: dict | None, sub: list | None, broker: dict | None, spark: dict | None = None) -> list[dict]:
    """spark: mqbatch.conformance.spark_job.run_spark's result, when the Spark job was run."""
    rows = []
    for r in REQUIREMENTS:
        kind = r.check[0]
        if kind == "spark":
            v, ev = _spark_verdict(spark)
        elif kind == "pub":
            v, ev = _pub_verdict(r.check[1], pub)
        elif kind == "sub":
            v, ev = _sub_verdict(r.check[1], sub, *r.check[2:])
        elif kind == "pub+sub":
            (v1, e1), (v2, e2) = _pub_verdict(r.check[1], pub), _sub_verdict(r.check[2], sub)
            v = FAIL if FAIL in (v1, v2) else (PASS if (v1, v2) == (PASS, PASS) else NOT_TESTED)
            ev = f"publisher: {v1}: {e1}\nsubscriber: {v2}: {e2}"
        elif kind == "broker":
            res = (broker or {}).get(r.check[1])
            v, ev = (
                (NOT_TESTED, "broker checks not run")
                if res is None
                else (PASS if res["passed"] else FAIL, res["evidence"])
            )
        else:
            v, ev = NOT_TESTED, r.check[1]
        rows.append(
            {
                "id": r.id,
                "section": r.section,
                "level": r.level,
                "text": r.text,
                "how": r.how,
                "verdict": v,
                "evidence": ev,
            }
        )
    return rows


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", "<br>")


def _case_table(cases: list) -> list[str]:
    out = ["| case | class | options | expected | result |", "|---|---|---|---|---|"]
    for c in cases:
        res = (
            "pass" if c["passed"] else "FAIL: " + "; ".join(x["evidence"] for x in c["checks"] if x["passed"] is False)
        )
        out.append(
            f"| {c['case']} | {c['class']} | {json.dumps(c['options']) if c['options'] else '-'} | "
            f"{c['expect'][0]} {c['expect'][1] or ''} | {_cell(res[:400])} |"
        )
    return out


def markdown(report: dict) -> str:
    rows = report["requirements"]
    counts = {k: sum(1 for r in rows if r["verdict"] == k) for k in (PASS, FAIL, NOT_TESTED)}
    out = [
        "# Conformance report",
        "",
        "Generated by `mqbatch conformance` (host/mqbatch/conformance/); do not edit by hand. Regenerate "
        "with the command below.",
        "",
        f"- command: `{report['command']}`",
        f"- date (UTC): {report['date']}",
        f"- publisher under test: {report.get('publisher') or 'not run'}",
        *(
            [
                f"- publisher's configured limits, checked on every batch: {report['publisher_run']['limits'][0]} "
                f"sub-messages, {report['publisher_run']['limits'][1]} payload bytes"
            ]
            if report.get("publisher_run")
            else []
        ),
        f"- subscriber under test: {report.get('subscriber') or 'not run'}",
        f"- broker: {report.get('broker_version', 'Mosquitto')} on 127.0.0.1, plain TCP through the inspecting "
        "proxy (mqbatch.conformance.proxy)",
        f"- result: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[NOT_TESTED]} NOT TESTED",
        "",
        "How the harness works: the last section of this page.",
        "",
        "## Requirements",
        "",
        "| id | § | level | requirement | how checked | verdict | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['id']} | {r['section']} | {r['level']} | {_cell(r['text'])} | {_cell(r['how'])} | "
            f"**{r['verdict']}** | {_cell(r['evidence'][:1200])} |"
        )
    pub = report.get("publisher_run")
    if pub:
        out += [
            "",
            "## Publisher scenarios",
            "",
            "| scenario | what | broker options | QoS | publisher | delivered (witness) | max PUBLISH | DUP | "
            "connections | peak in flight / Receive Max | violations |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for sc in pub["scenarios"]:
            p = sc["publisher"]
            pubres = (
                f"exit {p['exit']}"
                + (
                    f", stored {p['stored_records']}, acked {p['acked_records']}, dropped {p['dropped']}"
                    if "stored_records" in p
                    else ""
                )
                + (f", {p['split_batches']} stored batches split" if p.get("split_batches") else "")
            )
            peak = sc["peak_inflight"].get("c2s")
            vio = ", ".join(sorted({f"{v['direction']} {v['rule']}" for v in sc["violations"]})) or "none"
            opts = json.dumps(sc["broker"]) if sc["broker"] else "defaults"
            peak_s = f"{peak[0]} / {peak[1]}" if peak else "-"
            out.append(
                f"| {sc['scenario']} | {_cell(sc['what'])} | {opts} | {sc['qos']} | {pubres} | "
                f"{sc['delivered']['batches']} batches, {sc['delivered']['records']} records | "
                f"{sc['max_publish']} B | {sc['dup_publishes']} | {sc['connections']} | {peak_s} | {vio} |"
            )
        out += [
            "",
            "### Bytes on the wire per packet type (all scenarios)",
            "",
            "| direction packet | packets | bytes |",
            "|---|---|---|",
        ]
        tot_p, tot_b = {}, {}
        for sc in pub["scenarios"]:
            for k, n in sc["packets"].items():
                tot_p[k] = tot_p.get(k, 0) + n
                tot_b[k] = tot_b.get(k, 0) + sc["bytes"][k]
        out += [f"| {k} | {tot_p[k]} | {tot_b[k]} |" for k in sorted(tot_p)]
        out += ["", "### Trace excerpts", ""]
        for sc in pub["scenarios"]:
            out += [f"{sc['scenario']}:", "", "```", sc["trace"], *sc["violation_traces"], "```", ""]
        notes = [
            f"- {sc['scenario']}: " + " / ".join(sc["publisher"]["log_tail"][-3:])
            for sc in pub["scenarios"]
            if sc["publisher"].get("log_tail")
        ]
        out += ["### Publisher log (last lines per scenario)", "", *map(_cell, notes)]
    if pub:
        found = [sc for sc in pub["scenarios"] if sc["publisher"]["exit"] != 0 or not sc["delivered"]["records"]]
        out += ["", "### Findings (publisher did not deliver)", ""]
        out += [
            f"- {sc['scenario']} ({_cell(sc['what'])}): exit {sc['publisher']['exit']}, "
            f"{sc['delivered']['records']} records delivered, {sc['connections']} connections, CONNACK codes "
            f"{sc.get('connack_codes')}; last log: {_cell(' / '.join(sc['publisher']['log_tail'][-1:]))}"
            for sc in found
        ] or ["- none"]
    sub = report.get("subscriber_run")
    if sub:
        out += ["", "## Subscriber corpus", "", *_case_table(sub)]
    spark = report.get("spark_run")
    if spark:
        out += [
            "",
            "## Spark job as the subscriber (mqbatch.conformance.spark_job)",
            "",
            f"- records/: {'pass' if spark['records_check']['passed'] else 'FAIL'}: "
            f"{_cell(spark['records_check']['evidence'])}",
            *(f"- {_cell(x)}" for x in _not_applicable(spark["cases"])),
            "",
            *_case_table(spark["cases"]),
        ]
    out += ["", HOW]
    return "\n".join(out) + "\n"


HOW = """## How the harness works

- `mqbatch conformance publisher [--cmd ...] [--full]`, `mqbatch conformance subscriber [--cmd ...]`,
  `mqbatch conformance all --full --markdown docs/conformance.md --json docs/conformance.json` (this page).
  Exit status 1 on any FAIL. `make test` runs the short matrix (`tests/conformance/test_conformance.py`).
- The inspecting proxy (`mqbatch.conformance.proxy.Proxy`, also `mqbatch.scenarios.netcut.Relay`) sits on plain TCP between the
  publisher and Mosquitto on 127.0.0.1, forwards every byte unchanged, and parses every MQTT 5 packet with
  its own parser (`mqbatch.conformance.packets`, not shared with the firmware or paho-mqtt). TLS is not
  terminated: a TLS connection is relayed and counted but not parsed, so the conformance matrix uses
  plain-TCP listeners on loopback; TLS itself is tested elsewhere (BATCH-7-3).
- Faults are injected by the proxy: a packet dropped with the link (resume-dup, qos2-recovery), a link cut
  in the middle of a PUBLISH, connects refused, the link stalled and delayed.
- A third-party publisher is tested with `--cmd`: the command gets MQBATCH_HOST, MQBATCH_PORT,
  MQBATCH_TOPIC, MQBATCH_CLIENT_ID, MQBATCH_QOS, MQBATCH_DURATION_S, MQBATCH_SESSION_EXPIRY_S (and the
  same names in braces in its arguments), publishes batches for that long, then disconnects and exits.
  Example: `mqbatch conformance publisher --cmd "python -m mqbatch.conformance.paho"` (a small paho-mqtt
  batch publisher).
- A subscriber is tested with `--cmd` speaking the JSON Lines protocol of `mqbatch decode` (input lines
  may carry `client_id`; the options arrive as `--max-batch-size`, `--max-payload-bytes`, `--partial`,
  `--no-empty`; a JSON log record on stderr for every batch that is not ok).
- The Spark job (`mqbatch.spark`, `spark_jobs/telemetry_job.py`) is the subscriber under test of row
  BATCH-3.2-SPARK with `--spark` (or `--full`): `mqbatch.conformance.spark_job` writes the corpus as a real
  landing zone (one Parquet file per option group), runs the job's decode step per group with those
  JobOptions in one local Spark session, and reads the verdict from the landed row's batch_status, the
  reason from the batch-stage row, the delivered sub-messages from the rows with a sub_index, and the log
  from the batch's quarantine row (topic, user properties, reason, detail). It then runs the full batch
  job (run_batch) once on the default-options cases: no records/ row may come from a discarded batch.
  The corpus sub-messages are real mqbatch records, so a leak would land. The publisher's client id is
  "not applicable" for the job (MQTT 5 does not forward it to subscribers), reported with that reason.
  `make test` runs it in `tests/conformance/test_conformance_spark.py` with the shared test session.
- The device's packet parsers are also fuzzed inside the Unix port (`tests/conformance/test_conformance_fuzz.py`, 50,000
  inputs in `make test`; long run: `MICROPYPATH=firmware:tests/mpy .venv/bin/micropython
  tests/mpy/fuzz_packet.py 5000000 7`), figures in docs/mqtt-client.md.
"""
