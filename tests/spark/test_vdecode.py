"""The vectorised decoder (mqbatch.spark.vdecode) against the Spark job's reference path
(decode_batches): identical Arrow output on every shared vector and on 100,000+
generated and mutated landed PUBLISHes (tests/spark/vdecode_diff.py; the 10 M run is
documented in docs/spark.md)."""

from __future__ import annotations

import ast
import importlib.util
import os
import random
import sys

import pyarrow as pa
import pytest

from mqbatch.spark import batch_hmac, vdecode
from mqbatch.util.paths import ROOT
from mqbatch.wire import codec, records


def _load_diff():
    spec = importlib.util.spec_from_file_location("vdecode_diff", ROOT / "tests" / "spark" / "vdecode_diff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


diff = _load_diff()


def reference():
    """The reference decoder's module (decode_batches, JobOptions, _arrow_schema): one place to re-point."""
    return diff.reference_module()


def test_schema_is_the_spark_jobs():
    ref = reference()
    assert vdecode.DECODED == ref._arrow_schema()
    assert vdecode.DECODED.equals(ref._arrow_schema(), check_metadata=True)
    assert vdecode.LANDED_COLUMNS == ref.LANDED_COLUMNS


def _imports(path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {
        f"{n.module}:{a.name}" if n.module.startswith("mqbatch") else n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    return imported


def test_module_is_pure():
    """Imports only pyarrow, numpy, hashlib, json and mqbatch's pure codec/records and the
    job's pure batch-hmac check (itself only integrity/records): no pyspark, no I/O."""
    assert _imports(ROOT / "host" / "mqbatch" / "spark" / "vdecode.py") == {
        "__future__",
        "hashlib",
        "json",
        "typing",
        "numpy",
        "pyarrow",
        "mqbatch.wire:codec",
        "mqbatch.wire:records",
        "mqbatch.spark:batch_hmac",
    }
    assert _imports(ROOT / "host" / "mqbatch" / "spark" / "batch_hmac.py") == {
        "__future__",
        "mqbatch.wire:integrity",
        "mqbatch.wire:records",
    }


def test_every_shared_vector_decodes_identically():
    ref = reference()
    out = diff.Outcome()
    for batch, opts in diff.vector_batches(ref):
        diff.compare(batch, opts, ref, out)
    assert [d[2] for d in out.differences] == []
    assert out.cases == 2 * len(diff.json.load(open(ROOT / "tests" / "vectors" / "batch_v1.json"))["vectors"])
    assert set(codec.REASON_CODES) <= set(out.reasons)


# generated landed rows of the differential: 30,000 in `make test` (the 100,000 took 74-120 s
# of CPU in CI), 100,000 in `make test-long` (MQBATCH_VDECODE_CASES=100000)
VDECODE_CASES = int(os.environ.get("MQBATCH_VDECODE_CASES", "30000"))


@pytest.mark.slow  # so that `make test-long` (-m "long or slow") runs it at its full size
def test_generated_and_mutated_batches_decode_identically():
    out = diff.run(VDECODE_CASES, seed=20261123, vectors=False)
    assert out.cases >= VDECODE_CASES
    assert [d[2] for d in out.differences[:3]] == [], len(out.differences)
    # the run covered every reason code, valid records, and both paths of the decoder
    want = set(codec.REASON_CODES) | {records.TOPIC_INVALID} | set(records.RECORD_REASONS) | {None}
    want |= set(batch_hmac.REASONS)  # signed, unsigned, tampered, malformed, unknown device
    assert want <= set(out.reasons), want - set(out.reasons)
    assert out.reasons[None] > VDECODE_CASES
    print(f"vdecode differential: {out.cases:,} cases, {out.records:,} output rows, {out.stats}")


def test_valid_binary_records_take_no_reference_path():
    ref = reference()
    rng = random.Random(5)
    rows = []
    for i in range(50):
        subs = [records.encode_binary("sample", 1, i * 10 + j, diff.T0_MS, [(1, 2150), (3, 3300)]) for j in range(10)]
        props, payload = codec.encode_batch(subs)
        rows.append(
            {
                "topic": f"mqbatch/d{rng.randrange(3)}/telemetry",
                "payload": payload,
                "user_properties": [{"key": k, "value": v} for k, v in props],
                "qos": 1,
                "retain": False,
                "received_at": diff.T0_MS * 1000,
                "dup": False,
                "recorder": "r",
                "segment": 0,
                "offset": i,
            }
        )
    stats: dict = {}
    batch = diff.landed_batch(rows)
    got = vdecode.decode_arrow(batch, ref.JobOptions(), stats)
    assert stats == {"fallback_rows": 0, "fallback_records": 0}
    assert got.num_rows == 500 and got.column("reason").null_count == 500
    want = pa.Table.from_batches(list(ref.decode_batches(iter([batch]), ref.JobOptions())))
    assert pa.Table.from_batches([got]).equals(want)


def test_sliced_and_empty_batches():
    ref = reference()
    rng = random.Random(9)
    batch = diff.landed_batch([diff.case(rng) for _ in range(60)])
    for part in (batch.slice(7, 30), batch.slice(0, 0), batch.slice(59, 1)):
        out = diff.Outcome()
        diff.compare(part, ref.JobOptions(partial=True), ref, out)
        assert [d[2] for d in out.differences] == []


POISON = {
    # records.parse: int() of a JSON integer over 4,300 digits raised ValueError (issue 10 finding 3)
    "json-int-5000-digits": (
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":' + b"9" * 5000 + b',"synced":true,"r":{}}',
        diff.T0_MS * 1000,
    ),
    # a JSON ts_ms past int64 microseconds with no received_at: device_time overflowed (OverflowError)
    "json-ts-overflow": (
        b'{"v":1,"kind":"sample","boot":1,"seq":1,"ts_ms":10000000000000000000,"synced":true,"r":{}}',
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(POISON))
def test_poison_records_are_quarantined_by_both_paths(name):
    """Records that once crashed the reference path: both paths now quarantine them alike."""
    ref = reference()
    record, received_at = POISON[name]
    props, payload = codec.encode_batch([record])
    batch = diff.landed_batch(
        [
            {
                "topic": "mqbatch/d/telemetry",
                "payload": payload,
                "user_properties": [{"key": k, "value": v} for k, v in props],
                "qos": 1,
                "retain": False,
                "received_at": received_at,
                "dup": False,
                "recorder": "r",
                "segment": 0,
                "offset": 0,
            }
        ]
    )
    out = diff.Outcome()
    diff.compare(batch, ref.JobOptions(), ref, out)
    assert out.differences == [] and out.equal_errors == 0
    rows = pa.Table.from_batches(list(ref.decode_batches(iter([batch]), ref.JobOptions()))).to_pylist()
    assert [(r["stage"], r["reason"]) for r in rows] == [("record", records.MALFORMED)]


def test_pipeline_falls_back_to_the_reference_when_the_vectorised_decoder_fails(monkeypatch, capsys):
    """A bug in the fast path must neither stop the job nor lose the batch: the batch is
    decoded by the reference path and the failure is said."""
    from mqbatch.spark import decoder

    ref = reference()
    batch = diff.landed_batch([diff.case(random.Random(3)) for _ in range(20)])
    want = pa.Table.from_batches(list(ref.decode_batches(iter([batch]), ref.JobOptions())))

    def broken(batch, opts):
        raise IndexError("simulated vdecode bug")

    monkeypatch.setattr(vdecode, "decode_arrow", broken)
    got = pa.Table.from_batches([decoder.decode_vectorised(batch, ref.JobOptions())])
    assert got.equals(want)
    assert (
        "vectorised decoder failed on a batch of 20 landed rows (IndexError: simulated vdecode bug)"
        in capsys.readouterr().err
    )


@pytest.mark.scaled  # at its full size (200 option sets, ~20,000 rows) in `make test-long`
def test_compact_rows_are_the_full_rows_without_what_records_do_not_need():
    """decode_arrow(compact=True), the batch job's rows, equals decoder.compact of the
    reference's rows: the columns NOT_FOR_RECORDS null on valid record rows only, every
    quarantine row whole; on the shared vectors and generated landed rows (up to 200 per
    option set: 60 sets in `make test`, 200 with MQBATCH_VDECODE_CASES=100000)."""
    from mqbatch.spark import decoder

    ref = reference()
    rng = random.Random(20261125)
    sets = max(20, 200 * VDECODE_CASES // 100_000)
    batches = diff.vector_batches(ref) + [
        (diff.landed_batch([diff.case(rng) for _ in range(rng.randint(0, 200))]), diff.job_options(rng, ref))
        for _ in range(sets)
    ]
    valid = quarantined = 0
    for batch, opts in batches:
        full = pa.Table.from_batches(list(ref.decode_batches(iter([batch]), opts)))
        want = pa.Table.from_batches([decoder.compact(b) for b in full.to_batches()], schema=full.schema)
        got = pa.Table.from_batches([vdecode.decode_arrow(batch, opts, compact=True)])
        assert got.equals(want), diff._first_difference(want, got)
        assert pa.Table.from_batches([decoder.decode_vectorised(batch, opts, compact_rows=True)]).equals(got)
        rows = full.to_pylist()
        valid += sum(r["reason"] is None and r["sub_index"] is not None for r in rows)
        quarantined += sum(r["reason"] is not None for r in rows)
    assert valid > 50 * sets and quarantined > 5 * sets, (valid, quarantined)
    # what is left out: exactly the NOT_FOR_RECORDS columns of valid record rows
    kept = [r for r in got.to_pylist() if r["reason"] is None and r["sub_index"] is not None]
    assert kept and all(r[c] is None for r in kept for c in vdecode.NOT_FOR_RECORDS)
    assert all(r["topic"] and r["readings"] is not None for r in kept)


def test_compact_fallback_to_the_reference(monkeypatch):
    from mqbatch.spark import decoder

    ref = reference()
    batch = diff.landed_batch([diff.case(random.Random(4)) for _ in range(20)])
    want = decoder.compact(decoder.decode_arrow(batch, ref.JobOptions()))

    def broken(batch, opts, compact=False):
        raise IndexError("simulated vdecode bug")

    monkeypatch.setattr(vdecode, "decode_arrow", broken)
    assert decoder.decode_vectorised(batch, ref.JobOptions(), compact_rows=True).equals(want)
