"""Host reference codec: shared vectors, CLI, and property-based tests."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbatch.wire import codec
from mqbatch_testing import VENV_BIN, load_vectors

VECTORS_LIST = load_vectors()


def options_of(v: dict) -> codec.DecodeOptions:
    return codec.DecodeOptions(**v["options"])


@pytest.mark.fast
@pytest.mark.parametrize("v", VECTORS_LIST, ids=[v["name"] for v in VECTORS_LIST])
def test_vector_decodes_as_expected(v):
    res = codec.decode(v["user_properties"], bytes.fromhex(v["payload_hex"]), options_of(v), topic="t/vec")
    assert (res.status, res.reason) == (v["expect"]["status"], v["expect"]["reason"])
    assert [m.hex() for m in res.messages] == v["expect"]["messages_hex"]
    assert res.log["topic"] == "t/vec"
    if res.status == codec.OK:
        assert res.log["level"] == "info"
    else:
        assert res.log["reason"] == res.reason and res.log["detail"]
        assert res.log["level"] == ("warning" if res.status == codec.PARTIAL else "error")


@pytest.mark.fast
@pytest.mark.parametrize("v", [v for v in VECTORS_LIST if v["encode"]], ids=lambda v: v["name"])
def test_host_encoder_reproduces_valid_vectors(v):
    msgs = [bytes.fromhex(m) for m in v["expect"]["messages_hex"]]
    props, payload = codec.encode_batch(msgs, max_batch_size=10**6, max_payload_bytes=10**9)
    assert payload.hex() == v["payload_hex"]
    assert props == [("batch-format", "v1"), ("batch-size", str(len(msgs)))]


@pytest.mark.fast
def test_every_reason_code_has_a_vector():
    seen = {v["expect"]["reason"] for v in VECTORS_LIST}
    assert set(codec.REASON_CODES) <= seen


def test_partial_warning_reports_counts_and_kind():
    fewer = codec.decode(
        [("batch-format", "v1"), ("batch-size", "3")], b"\x01a\x01b", codec.DecodeOptions(partial=True)
    )
    assert fewer.status == codec.PARTIAL and fewer.log["level"] == "warning"
    assert (fewer.log["processed"], fewer.log["expected"], fewer.log["mismatch"]) == (2, 3, "fewer found")
    trailing = codec.decode(
        [("batch-format", "v1"), ("batch-size", "1")], b"\x01a\x01b", codec.DecodeOptions(partial=True)
    )
    assert trailing.log["mismatch"] == "trailing data" and trailing.messages == [b"a"]


def test_log_carries_topic_client_and_properties():
    res = codec.decode([("batch-format", "v3"), ("batch-size", "1")], b"\x01a", topic="d/1", client_id="c1")
    assert res.log["topic"] == "d/1" and res.log["client_id"] == "c1"
    assert res.log["properties"] == {"batch-format": ["v3"], "batch-size": ["1"]}
    assert "v3" in res.log["detail"]


def test_encoder_limits_are_errors_not_truncation():
    with pytest.raises(codec.EncodeError, match="at least one"):
        codec.encode_batch([])
    with pytest.raises(codec.EncodeError, match="101 sub-messages exceed max_batch_size 100"):
        codec.encode_batch([b"x"] * 101)
    with pytest.raises(codec.EncodeError, match="exceeds max_payload_bytes 10"):
        codec.encode_batch([b"x" * 10], max_payload_bytes=10)


@pytest.mark.parametrize(
    "n,encoded",
    [
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16383, "ff7f"),
        (16384, "808001"),
        (2097151, "ffff7f"),
        (2097152, "80808001"),
        (268435455, "ffffff7f"),
    ],
)
def test_vbi_encoding_matches_mqtt_table(n, encoded):
    assert codec.vbi_encode(n).hex() == encoded


@pytest.mark.parametrize("n", [-1, 268435456])
def test_vbi_out_of_range(n):
    with pytest.raises(ValueError, match="out of range"):
        codec.vbi_encode(n)


# ---- property-based -----------------------------------------------------------

submessages = st.lists(st.binary(max_size=300), min_size=1, max_size=100)


@pytest.mark.fast
@given(submessages)
@settings(max_examples=300, deadline=None)
def test_round_trip(msgs):
    props, payload = codec.encode_batch(msgs)
    res = codec.decode(props, payload)
    assert res.status == codec.OK and res.messages == msgs


text_or_bytes = st.one_of(
    st.text(max_size=12),
    st.binary(max_size=12),
    st.sampled_from(["batch-format", "batch-size", "v1", "1", "2", "100", "0"]),
)


# both shapes of a user property (issue 13), and mappings that are neither
property_shapes = st.one_of(
    st.tuples(text_or_bytes, text_or_bytes),
    st.builds(lambda k, v: {"key": k, "value": v}, text_or_bytes, text_or_bytes),
    st.dictionaries(st.sampled_from(["key", "value", "name"]), text_or_bytes, max_size=3),
)
batch_sizes = st.one_of(st.integers(1, 200).map(str), st.sampled_from(["10000000000000", "1" + "0" * 5000, "0"]))
# limits as configured, small and beyond the old 10**12 cap (issue 10)
limits = st.one_of(st.integers(1, 200), st.sampled_from([10**12, 10**13, 2**70]))


# examples per fuzz test: 600 in `make test` (1,500 took 15 s of CPU for the two), 5,000 in
# `make test-long` (MQBATCH_FUZZ_EXAMPLES=5000)
FUZZ_EXAMPLES = int(os.environ.get("MQBATCH_FUZZ_EXAMPLES", "600"))


@pytest.mark.scaled
@given(
    st.lists(property_shapes, max_size=6),
    st.lists(batch_sizes, max_size=2),
    st.binary(max_size=400),
    limits,
    st.integers(1, 500),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
def test_hostile_input_never_raises(props, sizes, payload, max_batch, max_bytes, allow_empty, partial):
    props = [("batch-format", "v1")] * bool(sizes) + [("batch-size", s) for s in sizes] + props
    opts = codec.DecodeOptions(max_batch, max_bytes, allow_empty, partial)
    res = codec.decode(props, payload, opts)
    json.dumps(res.log, default=repr)  # `mqbatch decode` writes the log record as JSON
    if res.status != codec.DISCARDED:  # what is delivered is exactly the payload
        assert codec.encode_payload(res.messages) == payload[: len(codec.encode_payload(res.messages))]
    assert res.status in (codec.OK, codec.PARTIAL, codec.DISCARDED)
    if res.status == codec.OK:
        assert res.reason is None
    else:
        assert res.reason in codec.REASON_CODES
    if res.status == codec.PARTIAL:
        assert res.reason == codec.COUNT_MISMATCH and partial and res.messages
    if res.status == codec.DISCARDED:
        assert res.messages == []


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=20), st.binary(min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_valid_batch_with_trailing_bytes_is_count_mismatch(msgs, tail):
    props, payload = codec.encode_batch(msgs)
    res = codec.decode(props, payload + tail, codec.DecodeOptions(partial=True))
    assert res.reason == codec.COUNT_MISMATCH and res.status == codec.PARTIAL and res.messages == msgs


# ---- CLI ------------------------------------------------------------------------


def run_cli(*args: str, input: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "mqbatch"), "decode", *args], input=input, capture_output=True, text=True, timeout=60
    )


def test_cli_decodes_all_vectors_in_order():
    # group by options so each CLI run uses one set of flags
    groups: dict[tuple, list[dict]] = {}
    for v in VECTORS_LIST:
        o = v["options"]
        key = (
            o.get("max_batch_size", 100),
            o.get("max_payload_bytes", 65536),
            o.get("partial", False),
            o.get("allow_empty", True),
        )
        groups.setdefault(key, []).append(v)
    for (mbs, mpb, partial, allow_empty), vs in groups.items():
        args = ["--max-batch-size", str(mbs), "--max-payload-bytes", str(mpb)]
        args += ["--partial"] if partial else []
        args += [] if allow_empty else ["--no-empty"]
        lines = "".join(
            json.dumps({"topic": "t", "user_properties": v["user_properties"], "payload_hex": v["payload_hex"]}) + "\n"
            for v in vs
        )
        proc = run_cli(*args, input=lines)
        assert proc.returncode == 0, proc.stderr
        outs = [json.loads(x) for x in proc.stdout.splitlines()]
        assert len(outs) == len(vs)
        for v, out in zip(vs, outs):
            exp = v["expect"]
            assert out == {
                "status": exp["status"],
                "reason": exp["reason"],
                "count": len(exp["messages_hex"]),
                "messages_hex": exp["messages_hex"],
            }, v["name"]


def test_cli_bad_lines_get_error_and_rest_still_run(tmp_path):
    good = json.dumps(
        {"topic": "t", "user_properties": [["batch-format", "v1"], ["batch-size", "1"]], "payload_hex": "0161"}
    )
    bad_lines = [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"topic": 1, "user_properties": [], "payload_hex": ""}),
        json.dumps({"topic": "t", "user_properties": [["a"]], "payload_hex": ""}),
        json.dumps({"topic": "t", "user_properties": [], "payload_hex": "zz"}),
    ]
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join([good] + bad_lines + [good]) + "\n")
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "decode", str(f)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    outs = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [o["status"] for o in outs] == ["ok"] + ["error"] * 5 + ["ok"]
    assert all(o["error"] for o in outs[1:6])
    assert "not valid JSON" in outs[1]["error"] and "hexadecimal" in outs[5]["error"]


def test_cli_logs_discarded_batches_to_stderr():
    line = json.dumps({"topic": "dev/1", "user_properties": [["batch-size", "1"]], "payload_hex": "0161"})
    proc = run_cli(input=line + "\n")
    log = json.loads(proc.stderr.splitlines()[0])
    assert log["reason"] == codec.MISSING_PROPERTY and log["topic"] == "dev/1" and log["level"] == "error"


def test_cli_log_record_carries_the_client_id_of_its_line():
    """Spec §4.2: a log record includes the client id if available: `client_id` per input line."""
    bad = {"topic": "dev/1", "user_properties": [["batch-size", "1"]], "payload_hex": "0161"}
    lines = [dict(bad, client_id="dev-001"), bad, dict(bad, client_id=7)]
    proc = run_cli(input="".join(json.dumps(x) + "\n" for x in lines))
    assert proc.returncode == 0, proc.stderr
    logs = [json.loads(x) for x in proc.stderr.splitlines()]
    outs = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [lg["client_id"] for lg in logs] == ["dev-001", None]  # absent: null, as the decoder logs it
    assert [o["status"] for o in outs] == ["discarded", "discarded", "error"]
    assert "'client_id' must be a string" in outs[2]["error"]


def test_cli_rejects_bad_limits():
    proc = run_cli("--max-batch-size", "0", input="")
    assert proc.returncode == 2 and "must be >= 1" in proc.stderr


# ---- issue 10: the batch-size limit is exact for any size --------------------------


@pytest.mark.parametrize(
    "limit,size",
    [
        (10**12, str(10**12 + 1)),
        (10**13, "20000000000000"),
        (2**70, str(2**70 + 1)),
        (2**70, "1" + "0" * 5000),
        (10**12, "9" * 13),
    ],
)
def test_batch_size_over_a_large_limit_is_size_limit_exceeded(limit, size):
    res = codec.decode(
        [("batch-format", "v1"), ("batch-size", size)],
        b"\x01a",
        codec.DecodeOptions(max_batch_size=limit, max_payload_bytes=10**20),
    )
    assert (res.status, res.reason) == (codec.DISCARDED, codec.SIZE_LIMIT)
    assert f"exceeds max_batch_size {limit}" in res.log["detail"]


@pytest.mark.parametrize("limit,size", [(10**12, str(10**12)), (10**13, "5000000000000"), (2**70, str(2**70))])
def test_batch_size_at_or_under_a_large_limit_is_counted_exactly(limit, size):
    res = codec.decode(
        [("batch-format", "v1"), ("batch-size", size)], b"\x01a", codec.DecodeOptions(max_batch_size=limit)
    )
    assert (res.status, res.reason) == (codec.DISCARDED, codec.COUNT_MISMATCH)
    assert res.log["expected"] == int(size) and f"batch-size {size} but 1 sub-messages" in res.log["detail"]


def test_over_limit_batch_size_too_long_for_an_int_is_still_reported():
    size = "7" * 5000  # beyond CPython's int/str conversion limit (4300 digits)
    res = codec.decode([("batch-format", "v1"), ("batch-size", size)], b"\x01a")
    assert res.reason == codec.SIZE_LIMIT and res.log["expected"] is None
    json.dumps(res.log)  # the CLI writes it as JSON


# ---- issue 13: the landing table's {key, value} user properties --------------------


def test_user_properties_as_key_value_dicts_decode_like_pairs():
    from mqbatch.ingest import landing

    table = landing.to_table(
        [
            landing.Landed(
                "mqbatch/d/telemetry", b"\x01a\x01b", [("batch-format", "v1"), ("batch-size", "2")], received_at_us=0
            )
        ],
        "r",
        0,
    )
    props = table.column("user_properties").to_pylist()[0]
    assert props == [{"key": "batch-format", "value": "v1"}, {"key": "batch-size", "value": "2"}]
    res = codec.decode(props, b"\x01a\x01b")
    assert (res.status, res.messages) == (codec.OK, [b"a", b"b"])
    assert codec.decode(props, b"\x01a\x01b").log == codec.decode([tuple(p.values()) for p in props], b"\x01a\x01b").log


@pytest.mark.parametrize(
    "bad",
    [
        [{"key": "batch-format"}],
        [{"name": "batch-size", "value": "1"}],
        [{"key": "batch-format", "value": "v1", "extra": 1}],
    ],
)
def test_other_dicts_are_an_invalid_property_saying_why(bad):
    res = codec.decode(bad + [("batch-size", "1")], b"\x01a")
    assert res.reason == codec.INVALID_PROPERTY
    assert "key/value" in res.log["detail"]


# ---- record parser fuzz (structure-aware: header fields, readings, JSON objects) ----

from mqbatch.wire import records  # noqa: E402

T_REC = 1_795_000_000_000
channel_ids = st.one_of(st.sampled_from(sorted(records.CHANNELS)), st.integers(0, 255))
i32 = st.one_of(
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.sampled_from(
        sorted({b + d for c in records.CHANNELS.values() for b in (c.low, c.high) if b is not None for d in (-1, 0, 1)})
    ),
)


@st.composite
def binary_records(draw):
    """Mostly well-formed binary records of either kind, with one field often off."""
    kind = draw(st.sampled_from([1, 2, 1, 2, 0, 3]))
    own = sorted(c.id for c in records.CHANNELS.values() if records.KIND_CODES[c.kind] == kind)
    chans = draw(st.lists(st.one_of(st.sampled_from(own or [1]), channel_ids), max_size=34))
    readings = [(c, draw(i32)) for c in chans]
    n = draw(st.sampled_from([len(readings)] * 6 + [0, 33, 255, len(readings) + 1]))
    time_s = (T_REC // 1000 - records.EPOCH_2020_S) + draw(st.integers(-(10**6), 2 * 86400))
    head = records.HEADER.pack(
        draw(st.sampled_from([1] * 8 + [0, 2, 0x7B])),
        kind,
        draw(st.sampled_from([0, 1, 0, 1, 2, 0x81, 0xFF])),
        n & 0xFF,
        draw(st.integers(0, 0xFFFFFFFF)),
        draw(st.integers(0, 0xFFFFFFFF)),
        max(time_s, 0),
        draw(st.sampled_from([0, 999, 0, 999, 1000, 65535])),
    )
    data = head + b"".join(records.READING.pack(c, v) for c, v in readings)
    return data[: draw(st.sampled_from([None] * 6 + [0, 17, 20]))] + draw(st.sampled_from([b""] * 6 + [b"\x00"]))


json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=False), st.text(max_size=8)
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
json_records = st.builds(
    lambda base, drop, extra: json.dumps({**{k: v for k, v in base.items() if k not in drop}, **extra}).encode(),
    st.fixed_dictionaries(
        {
            "v": st.sampled_from([1, 1, 2, True]),
            "kind": st.sampled_from(["sample", "health", 1]),
            "boot": st.integers(-1, 1 << 33),
            "seq": st.integers(0, 1 << 32),
            "ts_ms": st.integers(-1, T_REC * 2),
            "synced": st.sampled_from([True, False, 1]),
            "r": st.dictionaries(st.sampled_from(sorted(records.CHANNEL_BY_NAME) + ["heat"]), i32, max_size=8),
        }
    ),
    st.sets(st.sampled_from(["v", "kind", "boot", "seq", "ts_ms", "synced", "r"]), max_size=2),
    st.dictionaries(st.sampled_from(["v", "r", "x", "ts_ms"]), json_values, max_size=2),
)


@pytest.mark.scaled
@given(
    st.one_of(binary_records(), json_records, st.binary(max_size=80)),
    st.one_of(st.none(), st.integers(T_REC - 86_400_000, T_REC + 86_400_000)),
)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
def test_record_parser_fuzz_only_raises_record_error(data, received_ms):
    try:
        rec = records.parse(data, received_ms)
    except records.RecordError as e:
        assert e.reason in records.RECORD_REASONS and e.detail
        return
    assert rec.kind in (records.SAMPLE, records.HEALTH) and len(rec.readings) <= records.MAX_READINGS
    if rec.format == "binary":  # a valid binary record is exactly its re-encoding
        assert records.encode_binary(rec.kind, rec.boot, rec.seq, rec.time_ms, rec.readings, rec.synced) == data
