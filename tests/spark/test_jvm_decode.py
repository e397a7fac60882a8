"""The decoder's JVM fast path (mqbatch.spark.jvm, java/BatchDecoder.java): the same rows
as the Python decoders on the shared vectors and on generated, mutated and edge-case
landed PUBLISHes (tests/spark/jvm_decode_diff.py; the long run is documented in docs/spark.md),
the exact edges of what it accepts, one evaluation per landed row, a jar built once and
shipped by `mqbatch spark`, and a loud fallback to Python where it cannot run."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest
from pyspark.sql import functions as F

from mqbatch.spark import JobOptions, jvm, pipeline
from mqbatch.util.paths import ROOT
from mqbatch.wire import codec, records
from mqbatch_testing import VENV_BIN
from mqbatch_testing.spark import T0_MS, landed, write_landing, write_rows

pytestmark = pytest.mark.spark


def _load_diff():
    spec = importlib.util.spec_from_file_location("jvm_decode_diff", ROOT / "tests" / "spark" / "jvm_decode_diff.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# landed rows of the differential: 1,500 in `make test` (232 s at 20,000 in CI, 159 s at 4,000), the full
# 20,000 in `make test-long` (MQBATCH_JVM_DIFF_CASES=20000)
DIFF_CASES = int(os.environ.get("MQBATCH_JVM_DIFF_CASES", "1500"))


@pytest.mark.slow
def test_fast_path_gives_the_python_decoders_rows(spark):
    outcome = _load_diff().run(spark, cases=DIFF_CASES, seed=7, groups=8)
    print(f"{outcome.cases} landed rows, {outcome.rows} decoded rows, {outcome.fast_landed} by the JVM fast path")
    assert outcome.differences == []
    assert outcome.cases >= DIFF_CASES and outcome.rows > outcome.cases
    # both paths are exercised in earnest
    assert 0.15 * outcome.cases < outcome.fast_landed < 0.85 * outcome.cases


@pytest.mark.parametrize("damage", ["one value", "one type"])
def test_the_differential_fails_on_a_fast_path_that_differs(spark, monkeypatch, damage):
    """The instrument above can fail: the fast path's rows (and only those) with their seq
    numbers off by one, or as doubles, are differences."""
    from pyspark.sql import functions as F

    from mqbatch.spark import pipeline

    real = pipeline._fast_rows

    def damaged(*args):
        rows = real(*args)
        if damage == "one value":
            return rows.withColumn("seq", F.col("seq") + 1)
        return rows.withColumn("seq", F.col("seq").cast("double"))

    monkeypatch.setattr(pipeline, "_fast_rows", damaged)
    outcome = _load_diff().run(spark, cases=60, seed=7, groups=1, vectors=False)
    assert outcome.fast_landed > 0 and outcome.differences, outcome
    kinds = {text.split(":")[0].split(" ")[0] for _, _, text in outcome.differences}
    assert kinds == ({"row"} if damage == "one value" else {"schemas"}), outcome.differences


RECEIVED_MS = T0_MS + 10_000


def rec(value=2150, time_ms=None, kind="sample", readings=None, flags=None, fmt="binary"):
    t = T0_MS if time_ms is None else time_ms
    enc = records.encode_json if fmt == "json" else records.encode_binary
    out = bytearray(enc(kind, 1, 2, t, readings if readings is not None else [(1, value), (3, 3300)]))
    if flags is not None:
        out[2] = flags
    return bytes(out)


def publish(subs, topic="mqbatch/dev-1/telemetry", props=None, received_ms=RECEIVED_MS, payload=None):
    """A landed row; received_ms None: one without received_at (written by write_rows)."""
    row = landed(topic, subs, received_ms or 0, props=props, payload=payload)
    return row if received_ms is not None else dataclasses.replace(row, received_at_us=None)


LIMIT_MS = JobOptions().max_future_s * 1000
EDGES = {  # name: (landed row, taken by the fast path)
    "valid": (publish([rec()]), True),
    "temperature at its maximum": (publish([rec(15000)]), True),
    "temperature 1 over": (publish([rec(15001)]), False),
    "temperature at its minimum": (publish([rec(-5000)]), True),
    "temperature 1 under": (publish([rec(-5001)]), False),
    "device time at the future limit": (publish([rec(time_ms=RECEIVED_MS + LIMIT_MS)]), True),
    "1 ms past it": (publish([rec(time_ms=RECEIVED_MS + LIMIT_MS + 1)]), False),
    "reserved flag bit": (publish([rec(flags=2)]), False),
    "health channel in a sample": (publish([rec(readings=[(0x80, 5)])]), False),
    "unknown channel": (publish([rec(readings=[(7, 5)])]), False),
    "duplicate channel": (publish([rec(readings=[(1, 5), (1, 6)])]), False),
    "32 readings are too many for sample channels": (publish([rec(readings=[(1, 5)] * 32)]), False),
    "health record, unbounded last_error": (publish([rec(kind="health", readings=[(0x84, -(1 << 31))])]), True),
    "no readings": (publish([rec(readings=[])]), True),
    "one JSON record among binary ones": (publish([rec(), rec(fmt="json")]), False),
    "device id of 64 characters": (publish([rec()], topic=f"mqbatch/{'d' * 64}/telemetry"), True),
    "device id of 65 characters": (publish([rec()], topic=f"mqbatch/{'d' * 65}/telemetry"), False),
    "non-ASCII device id": (publish([rec()], topic="mqbatch/d\u00e9v/telemetry"), False),
    "an extra plain property": (
        publish(
            [rec()],
            props=[("batch-format", "v1"), ("batch-size", "1"), ("site", "plant-7")],
            payload=codec.encode_payload([rec()]),
        ),
        True,
    ),
    "an extra property json.dumps escapes": (
        publish(
            [rec()],
            props=[("batch-format", "v1"), ("batch-size", "1"), ("site", 'a"b')],
            payload=codec.encode_payload([rec()]),
        ),
        False,
    ),
    "batch-size 01": (
        publish([rec()], props=[("batch-format", "v1"), ("batch-size", "01")], payload=codec.encode_payload([rec()])),
        False,
    ),
    "trailing byte": (
        publish(
            [rec()],
            props=[("batch-format", "v1"), ("batch-size", "1")],
            payload=codec.encode_payload([rec()]) + b"\x00",
        ),
        False,
    ),
    "no received_at": (publish([rec()], received_ms=None), False),
    "batch-size of 9 digits": (
        publish(
            [rec()], props=[("batch-format", "v1"), ("batch-size", "999999999")], payload=codec.encode_payload([rec()])
        ),
        False,
    ),
}


@pytest.mark.parametrize(
    "opts",
    [JobOptions(), JobOptions(max_batch_size=10**12, max_payload_bytes=10**20)],
    ids=["defaults", "limits-of-10^12"],
)
def test_what_the_fast_path_takes_at_the_edges(spark, tmp_path, opts):
    names = list(EDGES)
    landed_df = pipeline.read_landing(spark, write_rows(tmp_path / "landing", [EDGES[n][0] for n in names]))
    assert jvm.registered(spark)
    fast = {r.offset: r.fast for r in landed_df.select("offset", jvm.is_fast(spark, opts).alias("fast")).collect()}
    offsets = sorted(fast)
    got = {names[i]: fast[o] for i, o in enumerate(offsets)}
    assert got == {n: EDGES[n][1] for n in names}
    # and the decoded rows are the Python decoders' either way
    want = pipeline.decode(landed_df, opts, fast_path=False).toArrow().sort_by(_load_diff().SORT)
    have = pipeline.decode(landed_df, opts, fast_path=True).toArrow().sort_by(_load_diff().SORT)
    assert have.to_pylist() == want.to_pylist()


def test_the_fast_path_runs_once_per_landed_row(spark, tmp_path):
    """With a plain posexplode Spark infers a filter on size(records) and runs the decoder three
    times per landed row; the plan must name each of its two functions once."""
    write_landing(tmp_path / "landing", "r1", 0, [publish([rec()])])
    decoded = pipeline.job_decode(spark, pipeline.read_landing(spark, str(tmp_path / "landing")), JobOptions())
    plan = decoded._jdf.queryExecution().executedPlan().toString()
    # the scans list the filter as a DataFilter they cannot push down (not an evaluation)
    plan = "\n".join(line for line in plan.splitlines() if "FileScan" not in line)
    assert plan.count("mqbatch.BatchDecoder(") == 2, plan
    assert plan.count(").decode(topic") == 1, plan
    assert plan.count(").isFast(topic") == 1, plan
    assert decoded.where(F.col("reason").isNull()).count() == 1


def test_the_decoding_functions_name_a_wrong_call(spark, tmp_path):
    """The session functions behind the fast path say what is wrong with a call, at analysis."""
    write_landing(tmp_path / "landing", "r1", 0, [publish([rec()])])
    landed_df = pipeline.read_landing(spark, str(tmp_path / "landing"))
    jvm.is_fast(spark, JobOptions())
    name = f"{jvm.IS_FAST}_{jvm._key(JobOptions())}"
    with pytest.raises(Exception, match="takes 5 arguments"):
        landed_df.selectExpr(f"{name}(topic, payload, user_properties)").collect()
    with pytest.raises(Exception, match="last two arguments must not be nullable"):
        landed_df.selectExpr(
            f"{name}(topic, payload, user_properties, unix_micros(received_at), received_at IS NULL)"
        ).collect()
    # and with the arguments jvm.ARGUMENTS gives, a null received_at is "not fast", never null
    fast = landed_df.selectExpr(f"{name}(topic, payload, user_properties, 0L, true) AS f").collect()
    assert [r.f for r in fast] == [False]


def test_with_hmac_keys_the_fast_path_takes_only_the_batches_that_verify(spark, tmp_path):
    """--hmac-keys: batch_hmac.check in Java; every failure is left to the Python decoders, which name it."""
    import hashlib
    import hmac

    from mqbatch.wire import integrity

    key1, key2, other, short = b"1" * 32, b"2" * 32, b"o" * 32, b"short"
    subs = [rec()]
    _, payload = codec.encode_batch(subs)
    _, changed = codec.encode_batch([rec(2151)])  # as long, still a valid record: only the MAC can tell
    base = [("batch-format", "v1"), ("batch-size", "1")]

    def signed(dev="dev-1", k=key1, mac=None, extra=(), body=payload):
        topic = f"mqbatch/{dev}/telemetry"
        mac = mac or hmac.new(k, integrity.message(topic, base, payload), hashlib.sha256).hexdigest()
        return publish(subs, topic, props=[*base, *extra, (integrity.PROPERTY, mac)], payload=body)

    good = integrity.mac_hex(key1, "mqbatch/dev-1/telemetry", base, payload)
    cases = {  # name: the reference's reason (None: valid, and so the fast path's)
        "good": None,
        "good, dev-2": None,
        "unsigned": "BATCH_HMAC_MISSING",
        "tampered, still valid records": "BATCH_HMAC_INVALID",
        "a key not in the file": "BATCH_HMAC_INVALID",
        "dev-2's topic under dev-1's key": "BATCH_HMAC_INVALID",
        "a 5-byte key": "BATCH_HMAC_INVALID",
        "upper case": "BATCH_HMAC_MALFORMED",
        "repeated": "BATCH_HMAC_MALFORMED",
        "no key for dev-4": "BATCH_HMAC_NO_KEY",
    }
    rows = [
        signed(),
        signed("dev-2", key2),
        publish(subs),
        signed(body=changed),
        signed(k=other),
        signed("dev-2", key1),
        signed("dev-3", short),
        signed(mac=good.upper()),
        signed(extra=[(integrity.PROPERTY, good)]),
        signed("dev-4", other),
    ]
    write_landing(tmp_path / "landing", "r1", 0, rows)
    landed_df = pipeline.read_landing(spark, str(tmp_path / "landing"))
    opts = JobOptions(hmac_keys=(("dev-1", key1), ("dev-2", key2), ("dev-3", short)))
    fast = [r.f for r in landed_df.select(jvm.is_fast(spark, opts).alias("f")).orderBy("offset").collect()]
    assert dict(zip(cases, fast)) == {name: reason is None for name, reason in cases.items()}
    order = ["offset", "sub_index", "reason"]
    want = pipeline.decode(landed_df, opts, fast_path=False).orderBy(*order).collect()
    got = pipeline.decode(landed_df, opts, fast_path=True).orderBy(*order).collect()
    assert got == want
    assert [r.reason for r in want] == list(cases.values())
    plan = pipeline.decode(landed_df, opts, fast_path=True)._jdf.queryExecution().toString()
    assert key1.hex() not in plan and key2.hex() not in plan and "batch-hmac" in plan  # no key in a printed plan


def _live_in_driver(spark, class_name: str) -> int:
    """Live instances of class_name in the session's JVM, by `jcmd GC.class_histogram` (a full
    GC first: unreachable objects are not counted); skips the test where jcmd cannot."""
    import shutil

    if shutil.which("jcmd") is None:
        pytest.skip("no jcmd (a JDK tool) on PATH: the driver's live objects cannot be counted")
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    done = subprocess.run(["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.skip(f"jcmd cannot attach to the driver's JVM here: {(done.stderr or done.stdout).strip()[:200]}")
    return sum(int(line.split()[1]) for line in done.stdout.splitlines() if line.split()[3:4] == [class_name])


def test_a_stream_of_micro_batches_makes_its_decoders_once(spark, tmp_path):
    """Every micro-batch decodes with the same options (mqbatch.spark.stream): the session's
    functions are made once, not once per micro-batch. Each registration made a decoder that
    parses --hmac-keys into a map (10,000 devices: about 1.4 MB), and the session's plans kept
    old ones: a 10,000-device soak's stream (1 GB driver) ran out of heap after about 140
    micro-batches (docs/scale.md, run 16). Checked: the functions' builders stay the same
    objects, and the fast path's decoders live in the driver's JVM (counted by jcmd, after a
    full GC) do not grow from the 5th "micro-batch" to the 40th: before, about one more every
    two micro-batches (14 after 5, 43 after 60, alone in a session); now 6 to 8 from the fifth
    on (the functions' own and the copies the last job's tasks hold)."""
    keys = tuple((f"dev-{i}", i.to_bytes(4, "big") * 8) for i in range(2_000))
    opts = JobOptions(hmac_keys=keys)
    write_landing(tmp_path / "landing", "r1", 0, [publish([rec()])])
    registry = spark._jsparkSession.sessionState().functionRegistry()
    identity = spark._jvm.java.lang.System.identityHashCode

    def builders() -> list[int]:
        names = [f"{prefix}_{jvm._key(opts)}" for prefix in (jvm.DECODE, jvm.IS_FAST)]
        found = [
            registry.lookupFunctionBuilder(spark._jvm.org.apache.spark.sql.catalyst.FunctionIdentifier.apply(n))
            for n in names
        ]
        return [identity(f.get()) if f.isDefined() else None for f in found]

    def micro_batch():
        decoded = pipeline.job_decode(spark, pipeline.read_landing(spark, str(tmp_path / "landing")), opts)
        assert decoded.where(F.col("reason").isNull()).count() == 0  # unsigned: BATCH_HMAC_MISSING

    micro_batch()
    first = builders()
    assert None not in first
    for _ in range(4):
        micro_batch()
    before = _live_in_driver(spark, "mqbatch.jvm.BatchDecoder")
    for _ in range(35):
        micro_batch()
    assert builders() == first
    # (a margin for the copies the last job's tasks may still hold: two functions, two tasks)
    assert _live_in_driver(spark, "mqbatch.jvm.BatchDecoder") <= before + 6


def test_the_keys_reach_the_tasks_once_not_in_every_task_binary(spark, tmp_path):
    """With --hmac-keys of 10,000 devices the decoder serialises (into each stage's task
    binary) to a few hundred bytes, not the 750 kB keys text; two key sets in one JVM each
    verify under their own keys (the parsed keys are shared between copies of one set only)."""
    import hashlib
    import hmac

    from mqbatch.wire import integrity

    keys = tuple((f"dev-{i}", i.to_bytes(4, "big") * 8) for i in range(10_000))
    serialize = spark._jvm.org.apache.spark.util.Utils.serialize
    assert len(serialize(jvm.decoder(spark, JobOptions(hmac_keys=keys)))) < 2_000
    assert len(jvm.keys_text(JobOptions(hmac_keys=keys))) > 700_000
    # the batch job's counting decoders (a new function each) share the key set's one broadcast
    shared = jvm._SHARED[2].id()
    jvm.decoded(spark, JobOptions(hmac_keys=keys), counting=True)
    assert jvm._SHARED[2].id() == shared

    subs = [rec()]
    _, payload = codec.encode_batch(subs)
    base = [("batch-format", "v1"), ("batch-size", "1")]
    topic = "mqbatch/dev-1/telemetry"
    mac = hmac.new(b"a" * 32, integrity.message(topic, base, payload), hashlib.sha256).hexdigest()
    write_landing(
        tmp_path / "landing", "r1", 0, [publish(subs, topic, props=[*base, (integrity.PROPERTY, mac)], payload=payload)]
    )
    landed_df = pipeline.read_landing(spark, str(tmp_path / "landing"))
    for key, fast in [(b"a" * 32, True), (b"b" * 32, False), (b"a" * 32, True)]:
        opts = JobOptions(hmac_keys=(("dev-1", key),))
        assert [r.f for r in landed_df.select(jvm.is_fast(spark, opts).alias("f")).collect()] == [fast], key


def test_the_java_mac_reproduces_the_shared_vectors(spark):
    """tests/vectors/batch_hmac_v1.json (computed by integrity.sign; the device's mqb_hmac and
    the host's verify are held to the same): keys of 16, 32 and 64 bytes, other topics."""
    import json

    cases = json.loads((ROOT / "tests" / "vectors" / "batch_hmac_v1.json").read_text())["cases"]
    mac = spark._jvm.mqbatch.jvm.BatchDecoder.macHex
    got = [
        bytes(mac(bytes.fromhex(c["key"]), c["topic"], "v1", c["batch_size"], bytes.fromhex(c["payload"]))).decode()
        for c in cases
    ]
    assert got == [c["batch-hmac"] for c in cases]
    assert len({len(c["key"]) for c in cases}) >= 3


def test_the_jar_is_built_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("MQBATCH_JVM_CACHE", str(tmp_path / "cache"))
    first = jvm.jar()
    assert first is not None and first.parent == tmp_path / "cache" and first.stat().st_size > 1000
    monkeypatch.setattr(jvm, "_javac", lambda: pytest.fail("javac run again for a cached jar"))
    assert jvm.jar() == first
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no temp dir left


def test_without_a_jdk_the_fast_path_is_off_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MQBATCH_JVM_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(jvm, "_javac", lambda: None)
    monkeypatch.setattr(jvm, "_notes", set())
    assert jvm.jar() is None and jvm.with_jar("a.jar") == "a.jar"
    assert "no javac (a JDK) found: the JVM fast path is off" in capsys.readouterr().err


def test_spark_submit_ships_the_jar(tmp_path):
    dry = subprocess.run(
        [
            str(VENV_BIN / "mqbatch"),
            "spark",
            "--landing",
            "L",
            "--out",
            "O",
            "--print-command",
            "--pyfiles-zip",
            str(tmp_path / "mqbatch.zip"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    assert f"--jars {jvm.jar()} " in dry.stdout


MIXED = [publish([rec(), rec()]) for _ in range(3)] + [
    publish([rec(15001)]),
    publish([rec(fmt="json")]),
    publish([rec()], topic="not/telemetry"),
]


def test_decode_to_scans_once_when_every_row_is_fast_and_twice_otherwise(spark, tmp_path):
    parts = []

    def collect(rows, part):
        parts.append((part, rows.toArrow()))

    fast_only = pipeline.read_landing(spark, write_rows(tmp_path / "fast", MIXED[:3]))
    took = pipeline.decode_to(fast_only, JobOptions(), collect)
    assert took == {"python": 0} and [p for p, _ in parts] == [0]

    parts.clear()
    mixed = pipeline.read_landing(spark, write_rows(tmp_path / "mixed", MIXED))
    took = pipeline.decode_to(mixed, JobOptions(), collect, compact_rows=True)
    assert took == {"python": 3} and [p for p, _ in parts] == [0, 1]

    def key(r):
        return r["offset"], r["sub_index"] if r["sub_index"] is not None else -1, r["stage"] or "", r["reason"] or ""

    got = sorted((r for _, t in parts for r in t.to_pylist()), key=key)
    want = pipeline.decode(mixed, JobOptions(), compact_rows=True, fast_path=False).toArrow().to_pylist()
    assert got == sorted(want, key=key)


def test_a_landed_row_the_job_loses_fails_it_loudly(spark, tmp_path, monkeypatch):
    """The batch job accounts for every landed row of the files (Parquet footers): should a
    part of the decode step drop rows (here: the Python part returns nothing), it stops
    before report.json instead of reporting less."""
    landing = write_rows(tmp_path / "landing", MIXED)
    monkeypatch.setattr(
        pipeline,
        "_decode_python",
        lambda landed, opts, compact: landed.limit(0).mapInArrow(lambda batches: iter(()), pipeline.DECODED_SCHEMA),
    )
    with pytest.raises(RuntimeError, match="the landing files hold 6 rows but report.json accounted for 3"):
        pipeline.run_batch(spark, landing, str(tmp_path / "out"), JobOptions())
    assert not (tmp_path / "out" / "report.json").exists()
