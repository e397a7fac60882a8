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

import json

from mqbatch.conformance.requirements import _VERDICT, REQUIREMENTS, Req  # noqa: F401 (Req re-exported)

PASS, FAIL, NOT_TESTED = "PASS", "FAIL", "NOT TESTED"


# rule -> the name the session checker counts as "exercised" (session.Checker.applied)
_APPLIED = {
    "BATCH-FORMAT": "BATCH",
    "BATCH-SIZE": "BATCH",
    "BATCH-COUNT": "BATCH",
    "BATCH-PAYLOAD": "BATCH",
    "BATCH-LIMITS": "BATCH-LIMITS-REACHED",  # a batch exactly on a limit: one more would have failed
    "MQTT-VERSION": "MQTT-PACKET",
    "MQTT-REASON-CODE": "MQTT-PACKET",
    "HARNESS-ERROR": "MQTT-PACKET",
    "HARNESS-LIMIT": "MQTT-PACKET",
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
    if "MQTT-MAX-PACKET-SIZE" in rules and used:  # how close it came: only an exact fill can show +1
        closest = [
            f"{sc['scenario']}: largest PUBLISH {sc['max_publish']} of {sc['max_packet_size']} B"
            if not sc.get("probe_limits")
            else f"{sc['scenario']}: {len(sc['probe_limits'])} connections told {sc['probe_limits'][:8]}, "
            f"{sc['probe_exact']} PUBLISHes exactly on the limit told"
            for sc in pub["scenarios"]
            if sc.get("max_packet_size")
        ]
        used += [f"[{'; '.join(closest)}]"] if closest else []
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


def _delivery_verdict(pub: dict | None) -> tuple[str, str]:
    if not pub:
        return NOT_TESTED, "publisher suite not run"
    bad, good = [], []
    for sc in pub["scenarios"]:
        d = sc["delivery"]
        line = (
            f"{sc['scenario']}: exit {d['exit']}, stored {d['stored'] if d['stored'] is not None else 'not reported'}"
            f", {d['distinct']} distinct records delivered"
        )
        if d["ok"]:
            good.append(line)
        else:
            known = (
                f" (known: {sc['firmware_fails']})"
                if sc.get("firmware_fails") and "firmware" in pub["publisher"]
                else ""
            )
            tail = " / ".join(sc["publisher"].get("log_tail", [])[-2:])
            bad.append(f"{line}: {d['why']}{known}; last log: {tail[:300]}")
    if bad:
        return FAIL, "\n".join(bad + [f"{len(good)} other scenarios delivered"])
    return PASS, "\n".join(good)


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
        elif kind == "delivery":
            v, ev = _delivery_verdict(pub)
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
                "statements": list(r.statements),
                "same_as": r.same_as,
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
        sec = r["section"] + "".join(f"<br>[{x}]" for x in r.get("statements", []))
        how = r["how"] + (f" (the check of {r['same_as']})" if r.get("same_as") not in ("", None, "summary") else "")
        out.append(
            f"| {r['id']} | {sec} | {r['level']} | {_cell(r['text'])} | {_cell(how)} | "
            f"**{r['verdict']}** | {_cell(r['evidence'][:1200])} |"
        )
    out += _coverage_section()
    if report.get("selftest"):
        out += selftest_section(report["selftest"])
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


def _coverage_section() -> list[str]:
    from mqbatch.conformance.statements import coverage

    cov = coverage(REQUIREMENTS)
    n = sum(1 for c in cov if c[2] != "-")
    out = [
        "",
        "## MQTT 5.0 normative statements for a client (CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, "
        "PUBCOMP, PINGREQ, DISCONNECT, operational behaviour)",
        "",
        f"{n} of {len(cov)} statements listed here are checked by a row; the others say why not.",
        "",
        "| statement | what | checked by | why not |",
        "|---|---|---|---|",
    ]
    out += [f"| {sid} | {_cell(what)} | {by} | {_cell(why)} |" for sid, what, by, why in cov]
    return out


def selftest_section(st: dict) -> list[str]:
    """The self-test's table (mqbatch.conformance.selftest)."""
    out = [
        "",
        "## Self-test: the harness against its own faulty publishers",
        "",
        f"- command: `{st['command']}`",
        f"- kill rate: **{st['killed']} of {st['faulty']} faulty publishers failed on their own row and only "
        f"where a rule is broken ({st['rate']:.0%})**; the clean publisher passed everywhere: "
        f"{'yes' if st['clean_ok'] else 'NO'}",
        "",
        "| publisher | breaks | scenarios | expected FAIL | FAIL rows | result |",
        "|---|---|---|---|---|---|",
    ]
    for m in st["mutants"]:
        out.append(
            f"| {m['name']} | {_cell(m['what'])} | {', '.join(m['scenarios'])} | {m['row']} | "
            f"{', '.join(m['failed']) or '-'} | {'killed' if m['killed'] else 'SURVIVED: ' + _cell(m['why'])} |"
        )
    return out


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
- Acknowledgements withheld (scenarios with `hold_acks`): the proxy keeps PUBACK/PUBREC/PUBCOMP from the
  client until its unacknowledged PUBLISHes reach the server's Receive Maximum and 0.4 s more have passed
  (or 1 s at most), so a client that ignores Receive Maximum sends one too many, every time.
- Limits landed on exactly: scenarios limits-10-2048 and limits-100-400 give the publisher batch limits it fills
  with a backlog (row BATCH-3.1-5 PASSes only if some batch sat exactly on a limit); max-packet-120/128/200/600
  go down to the smallest packet that holds one record plus headers; max-packet-probe rewrites each
  CONNACK's Maximum Packet Size (same 4 bytes) to P - 1, then P, for P the most frequent full batch
  size seen, and cuts the connection once a full batch is acknowledged and nothing is open (FIN after
  that acknowledgement; what the client sent before it read the FIN is still read and checked, not
  forwarded: its resend with DUP after the resume is due), so a
  publisher whose budget is a byte too large builds P again, 1 byte over (mqbatch.conformance.probe).
- Delivery (row PUBLISHER-DELIVERS): a publisher that crashes, exits non-zero, is still running after
  60 s, or whose stored records do not all reach the witness subscriber FAILs, and the exit status is 1.
- The proxy cannot be knocked over: any byte stream either side sends is parsed to its end or named
  (unknown property identifier, MQTT 3.1.1 CONNECT, truncated packet, a length above the Maximum Packet
  Size) and relayed; a checker exception is row HARNESS's FAIL, never the end of the forwarding thread.
  Fuzzed: `python -m mqbatch.conformance.fuzz 1000000 7` (long run), 20,000 streams in `make test`
  (`tests/conformance/test_proxy_robust.py`).
- Self-test: `mqbatch conformance self-test [--full]` runs faulty publishers (raw-socket ones,
  `mqbatch.lab.rawpub`, and mutations of a temporary copy of the firmware) and a clean one through the
  harness; each must FAIL on its own row and nowhere a rule is not broken (section above; add it to
  this page with `--self-test FILE`, the JSON of `mqbatch conformance self-test --full --json FILE`).
  `make test` runs the short set (`tests/conformance/test_selftest.py`, about 80 s).
- The device's packet parsers are also fuzzed inside the Unix port (`tests/conformance/test_conformance_fuzz.py`, 50,000
  inputs in `make test`; long run: `MICROPYPATH=firmware:tests/mpy .venv/bin/micropython
  tests/mpy/fuzz_packet.py 5000000 7`), figures in docs/mqtt-client.md.
"""
