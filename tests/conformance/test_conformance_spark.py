"""The Spark job (mqbatch.spark) as the subscriber under test of the conformance corpus
(issue 12): the decode step per option group on a real landing zone, run_batch for
records/, and the BATCH-3.2-SPARK row built from that evidence. Uses the shared
session (`spark` fixture); `mqbatch conformance subscriber --spark` runs the same."""

from __future__ import annotations

import dataclasses
import json

from mqbatch.conformance import matrix as M
from mqbatch.conformance.spark_job import CLIENT_ID_ABSENT, outcome, partial_from_row, records_check, run_spark
from mqbatch.conformance.subscriber import check, corpus, result
from mqbatch.wire import codec


def test_spark_job_through_the_subscriber_corpus(spark, tmp_path):
    run = run_spark(spark, tmp_path)
    cases = run["cases"]
    assert sorted(c["case"] for c in cases) == sorted(c.name for c in corpus())
    failed = {(c["case"], x["aspect"]): x["evidence"] for c in cases for x in c["checks"] if x["passed"] is False}
    assert not failed, failed
    # the client id is not applicable, said with its reason, for every rejected case (never a silent pass)
    client = [x for c in cases for x in c["checks"] if x["aspect"] == "log client id"]
    assert client and all(x["passed"] is None and CLIENT_ID_ABSENT in x["evidence"] for x in client)
    assert len(client) == sum(1 for c in corpus() if c.status != "ok")
    rc = run["records_check"]
    default = [c for c in corpus() if not c.options]
    ids = {c["case"]: c["batch_id"] for c in cases}
    assert rc["by_batch"] == {
        ids[c.name]: len(c.messages) for c in default if c.name in ("properties-in-any-order", "at-max-batch-size")
    }, rc
    assert rc["passed"] and rc["records_rows"] > 0 and rc["discarded_batches"] >= 20 and not rc["leaked"], rc
    row = {r["id"]: r for r in M.verdicts(None, None, None, spark=run)}["BATCH-3.2-SPARK"]
    assert row["verdict"] == M.PASS, row
    assert "not applicable" in row["evidence"] and "records/" in row["evidence"]

    # the records/ check can fail: expect one ok batch discarded, and its records count as leaked
    flipped = [
        dataclasses.replace(c, status=codec.DISCARDED) if c.name == "properties-in-any-order" else c for c in default
    ]
    leak = records_check(flipped, [ids[c.name] for c in default], rc["by_batch"])
    assert not leak["passed"] and leak["leaked"] == {"properties-in-any-order": 2}, leak
    print(
        f"\nSpark subscriber corpus: {len(cases)} cases in {len(grouped_options(cases))} option groups, decode "
        f"{run['seconds']['decode']} s, run_batch {run['seconds']['run_batch']} s\n" + row["evidence"]
    )


def grouped_options(cases: list) -> set:
    return {json.dumps(c["options"], sort_keys=True) for c in cases}


def test_the_spark_mapping_fails_a_discarded_batch_that_delivers():
    """outcome() + check() on decoded rows as the job would write them for a discarded
    batch that (wrongly) also delivered its first sub-message: the delivered aspect
    fails; the client id is not applicable, never passed."""
    case = next(c for c in corpus() if c.name == "vbi-5-bytes")
    props = [{"key": k, "value": v} for k, v in case.props]
    base = {
        "offset": 0,
        "batch_id": "b",
        "batch_status": "discarded",
        "batch_count": 0,
        "detail": "sub-message 2",
        "topic": "mqbatch/sub-test/telemetry",
        "user_properties": props,
    }
    rows = [
        dict(base, landed_first=True, stage="batch", reason=case.reason, sub_index=None, sub_payload=None),
        dict(base, landed_first=False, stage=None, reason=None, sub_index=0, sub_payload=b"\x01"),
    ]
    out, log, bid = outcome(rows)
    got = {
        a: (p, e)
        for a, p, e in check(case, out, log, client_id_absent=CLIENT_ID_ABSENT, partial_check=partial_from_row)
    }
    assert bid == "b" and got["verdict"][0] and got["reason"][0] and got["log"][0], got
    assert got["delivered"] == (False, "1 sub-messages delivered (want 0)")
    assert got["log client id"][0] is None and got["log client id"][1].startswith("not applicable: MQTT 5")
    assert result(case, {}, list(check(case, out, log, client_id_absent=CLIENT_ID_ABSENT)))["passed"] is False
