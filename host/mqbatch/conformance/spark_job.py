"""The Spark job (mqbatch.spark) as the subscriber under test of the subscriber corpus
(mqbatch.conformance.subscriber): spec §3.2, §3.3, §4 on the same cases.

    run_spark(spark, workdir)   -> {"cases": [result...], "records_check": {...}}

The corpus is written as a real landing zone (mqbatch.ingest.landing, one Parquet file per
option group, offset = the case's place in its group) and the job's decode step
(mqbatch.spark.decode, vectorised) runs per option group as JobOptions. Its rows map
to the verdicts:

    status     the landed row's batch_status
    reason     the reason of the batch-stage row (none for an ok batch)
    delivered  sub_payload of the rows with a sub_index, in sub_index order
    log        the batch-stage quarantine row: the job's log record of a rejected
               batch (topic, user properties = batch properties, reason, detail,
               batch_status, batch_count)

The publisher's client id cannot reach the job: MQTT 5 does not forward it to
subscribers, so no recorder can land it; that aspect is "not applicable".
records_check: the full batch job (run_batch) once, on the default-options group: no row of
records/ may come from a batch the corpus expects discarded, and every valid record of
an ok batch must be there.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time

from mqbatch.conformance.subscriber import TOPIC, Case, check, groups, result
from mqbatch.ingest import landing
from mqbatch.wire import codec

RECORDER = "conformance"
RECEIVED_US = 1_795_000_500_000_000  # received_at of every corpus row (after the records' device times)
CLIENT_ID_ABSENT = (
    "MQTT 5 does not forward the publisher's client id to subscribers, so the recorder cannot "
    "land it and the Spark job never sees it (its quarantine rows carry topic, batch properties, "
    "reason and detail)"
)
_COLUMNS = [
    "offset",
    "landed_first",
    "batch_id",
    "batch_status",
    "batch_count",
    "stage",
    "reason",
    "detail",
    "sub_index",
    "sub_payload",
    "topic",
    "user_properties",
]


def write_landing(directory: pathlib.Path, segment: int, cases: list[Case]) -> pathlib.Path:
    """The cases as one landing file (offset i = cases[i]), as `mqbatch ingest` writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [landing.Landed(TOPIC, c.payload, [tuple(p) for p in c.props], received_at_us=RECEIVED_US) for c in cases]
    return landing.write_parquet_atomic(
        landing.to_table(rows, RECORDER, segment), directory, landing.parquet_name(RECORDER, segment)
    )


def job_options(opts: dict):
    from mqbatch.spark import JobOptions

    return JobOptions(
        partial=bool(opts.get("partial")),
        max_batch_size=opts.get("max_batch_size", 100),
        max_payload_bytes=opts.get("max_payload_bytes", 65536),
        allow_empty=not opts.get("no_empty"),
    )


def outcome(rows: list[dict]) -> tuple[dict, dict | None, str | None]:
    """(out, log, batch_id) of one landed row from its decoded rows (see the module doc)."""
    first = [r for r in rows if r["landed_first"]]
    batch = [r for r in rows if r["stage"] == "batch"]
    subs = sorted((r for r in rows if r["sub_index"] is not None), key=lambda r: r["sub_index"])
    out = {
        "status": first[0]["batch_status"] if len(first) == 1 else f"{len(first)} landed_first rows",
        "reason": batch[0]["reason"] if batch else None,
        "count": first[0]["batch_count"] if first else None,
        "messages_hex": [bytes(r["sub_payload"] or b"").hex() for r in subs],
    }
    log = None
    if batch:
        b = batch[0]
        props: dict[str, list[str]] = {}
        for p in b["user_properties"] or []:
            props.setdefault(p["key"], []).append(p["value"])
        log = {
            "topic": b["topic"],
            "properties": props,
            "reason": b["reason"],
            "detail": b["detail"],
            "batch_status": b["batch_status"],
            "batch_count": b["batch_count"],
            "rows": len(batch),
        }
    return out, log, first[0]["batch_id"] if first else None


def partial_from_row(case: Case, log: dict | None) -> tuple[bool, str]:
    """The job's partial warning: a quarantine row with batch_status partial, batch_count =
    the sub-messages processed, and a detail naming processed vs expected."""
    log = log or {}
    size = dict(case.props).get("batch-size")
    want = f"batch-size {size} but {len(case.messages)} sub-messages parsed"
    ok = (
        log.get("batch_status") == codec.PARTIAL
        and log.get("batch_count") == len(case.messages)
        and want in (log.get("detail") or "")
    )
    return ok, (
        f"quarantine row batch_status {log.get('batch_status')}, batch_count {log.get('batch_count')}, "
        f"detail {log.get('detail')!r} (want partial, {len(case.messages)}, '{want}')"
    )


def batch_records(spark, workdir: pathlib.Path, cases: list[Case]) -> dict[str, int]:
    """run_batch (the full batch job) on these cases: records/ rows per batch_id."""
    from pyspark.sql import functions as F

    from mqbatch.spark import run_batch

    land, out = workdir / "batch-landing", workdir / "batch-out"
    shutil.rmtree(out, ignore_errors=True)
    write_landing(land, 0, cases)
    run_batch(spark, str(land), str(out), job_options({}))
    if not any((out / "records").rglob("*.parquet")):
        return {}  # an empty records/ has no schema to read
    return {
        r["batch_id"]: r["n"]
        for r in spark.read.parquet(str(out / "records")).groupBy("batch_id").agg(F.count("*").alias("n")).collect()
    }


def records_check(cases: list[Case], batch_ids: list[str | None], got: dict[str, int]) -> dict:
    """records/ (rows per batch_id) against the corpus: none from a batch expected
    discarded, every valid record of an ok batch present."""
    from mqbatch.wire import records

    want: dict[str, int] = {}
    discarded: dict[str, str] = {}
    for c, bid in zip(cases, batch_ids):
        if c.status == codec.DISCARDED:
            discarded[bid] = c.name
        else:
            n = sum(1 for m in c.messages if _is_record(records, m))
            if n:
                want[bid] = n
    leaked = {discarded[b]: n for b, n in got.items() if b in discarded}
    wrong = {
        next(c.name for c, b in zip(cases, batch_ids) if b == bid): [got.get(bid, 0), n]
        for bid, n in want.items()
        if got.get(bid, 0) != n
    }
    passed = not leaked and not wrong and bool(want)
    return {
        "passed": passed,
        "records_rows": sum(got.values()),
        "ok_batches": len(want),
        "discarded_batches": len(discarded),
        "leaked": leaked,
        "wrong_counts": wrong,
        "by_batch": got,
        "evidence": (
            f"run_batch on {len(cases)} default-options cases: records/ holds {sum(got.values())} rows "
            f"from {len(got)} batches; {len(leaked)} of {len(discarded)} discarded batches reached "
            f"records/"
            + (f" ({json.dumps(leaked)})" if leaked else "")
            + (f"; ok batches with wrong record counts [got, want]: {json.dumps(wrong)}" if wrong else "")
            + ("" if want else "; no ok batch carried a valid record, so the check proved nothing")
        ),
    }


def _is_record(records, sub: bytes) -> bool:
    try:
        records.parse(sub, RECEIVED_US // 1000)
    except records.RecordError:
        return False
    return True


def run_spark(spark, workdir: str | pathlib.Path) -> dict:
    """The corpus through the job's decode step (one landing file per option group, its
    segment = the group; the groups' decodes unioned into one collect), then run_batch
    once for records/. See the module doc."""
    from functools import reduce

    from mqbatch.spark import decode, read_landing

    workdir = pathlib.Path(workdir)
    t0 = time.monotonic()
    grouped = [(json.loads(key), cases) for key, cases in groups().items()]
    frames = [
        decode(
            read_landing(spark, [str(write_landing(workdir / f"decode-{seg}", seg, cases))]), job_options(opts)
        ).select("segment", *_COLUMNS)
        for seg, (opts, cases) in enumerate(grouped)
    ]
    by_row: dict[tuple[int, int], list[dict]] = {}
    for r in reduce(lambda a, b: a.unionByName(b), frames).collect():
        by_row.setdefault((r["segment"], r["offset"]), []).append(r.asDict())
    results, default = [], None
    for seg, (opts, cases) in enumerate(grouped):
        ids = []
        for i, c in enumerate(cases):
            out, log, bid = outcome(by_row.get((seg, i), []))
            ids.append(bid)
            results.append(
                dict(
                    result(
                        c, opts, check(c, out, log, client_id_absent=CLIENT_ID_ABSENT, partial_check=partial_from_row)
                    ),
                    batch_id=bid,
                )
            )
        if not opts:
            default = (cases, ids)
    cases, ids = default
    t1 = time.monotonic()
    rc = records_check(cases, ids, batch_records(spark, workdir, cases))
    return {
        "cases": results,
        "records_check": rc,
        "seconds": {"decode": round(t1 - t0, 1), "run_batch": round(time.monotonic() - t1, 1)},
    }
