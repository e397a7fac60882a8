"""Host reference codec: shared vectors, CLI, and property-based tests."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from mqbatch import codec
from mqbatch_testing import VENV_BIN, VECTORS, load_vectors

VECTORS_LIST = load_vectors()


def options_of(v: dict) -> codec.DecodeOptions:
    return codec.DecodeOptions(**v["options"])


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


@pytest.mark.parametrize("v", [v for v in VECTORS_LIST if v["encode"]], ids=lambda v: v["name"])
def test_host_encoder_reproduces_valid_vectors(v):
    msgs = [bytes.fromhex(m) for m in v["expect"]["messages_hex"]]
    props, payload = codec.encode_batch(msgs, max_batch_size=10**6, max_payload_bytes=10**9)
    assert payload.hex() == v["payload_hex"]
    assert props == [("batch-format", "v1"), ("batch-size", str(len(msgs)))]


def test_every_reason_code_has_a_vector():
    seen = {v["expect"]["reason"] for v in VECTORS_LIST}
    assert set(codec.REASON_CODES) <= seen


def test_partial_warning_reports_counts_and_kind():
    fewer = codec.decode([("batch-format", "v1"), ("batch-size", "3")], b"\x01a\x01b",
                         codec.DecodeOptions(partial=True))
    assert fewer.status == codec.PARTIAL and fewer.log["level"] == "warning"
    assert (fewer.log["processed"], fewer.log["expected"], fewer.log["mismatch"]) == (2, 3, "fewer found")
    trailing = codec.decode([("batch-format", "v1"), ("batch-size", "1")], b"\x01a\x01b",
                            codec.DecodeOptions(partial=True))
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


@pytest.mark.parametrize("n,encoded", [(0, "00"), (127, "7f"), (128, "8001"), (16383, "ff7f"), (16384, "808001"),
                                       (2097151, "ffff7f"), (2097152, "80808001"), (268435455, "ffffff7f")])
def test_vbi_encoding_matches_mqtt_table(n, encoded):
    assert codec.vbi_encode(n).hex() == encoded


@pytest.mark.parametrize("n", [-1, 268435456])
def test_vbi_out_of_range(n):
    with pytest.raises(ValueError, match="out of range"):
        codec.vbi_encode(n)


# ---- property-based -----------------------------------------------------------

submessages = st.lists(st.binary(max_size=300), min_size=1, max_size=100)


@given(submessages)
@settings(max_examples=300, deadline=None)
def test_round_trip(msgs):
    props, payload = codec.encode_batch(msgs)
    res = codec.decode(props, payload)
    assert res.status == codec.OK and res.messages == msgs


text_or_bytes = st.one_of(st.text(max_size=12), st.binary(max_size=12),
                          st.sampled_from(["batch-format", "batch-size", "v1", "1", "2", "100", "0"]))


@given(st.lists(st.tuples(text_or_bytes, text_or_bytes), max_size=6), st.binary(max_size=400),
       st.integers(1, 200), st.integers(1, 500), st.booleans(), st.booleans())
@settings(max_examples=1500, deadline=None)
def test_hostile_input_never_raises(props, payload, max_batch, max_bytes, allow_empty, partial):
    opts = codec.DecodeOptions(max_batch, max_bytes, allow_empty, partial)
    res = codec.decode(props, payload, opts)
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
    return subprocess.run([str(VENV_BIN / "mqbatch"), "decode", *args], input=input, capture_output=True,
                          text=True, timeout=60)


def test_cli_decodes_all_vectors_in_order():
    # group by options so each CLI run uses one set of flags
    groups: dict[tuple, list[dict]] = {}
    for v in VECTORS_LIST:
        o = v["options"]
        key = (o.get("max_batch_size", 100), o.get("max_payload_bytes", 65536), o.get("partial", False),
               o.get("allow_empty", True))
        groups.setdefault(key, []).append(v)
    for (mbs, mpb, partial, allow_empty), vs in groups.items():
        args = ["--max-batch-size", str(mbs), "--max-payload-bytes", str(mpb)]
        args += ["--partial"] if partial else []
        args += [] if allow_empty else ["--no-empty"]
        lines = "".join(json.dumps({"topic": "t", "user_properties": v["user_properties"],
                                    "payload_hex": v["payload_hex"]}) + "\n" for v in vs)
        proc = run_cli(*args, input=lines)
        assert proc.returncode == 0, proc.stderr
        outs = [json.loads(x) for x in proc.stdout.splitlines()]
        assert len(outs) == len(vs)
        for v, out in zip(vs, outs):
            exp = v["expect"]
            assert out == {"status": exp["status"], "reason": exp["reason"], "count": len(exp["messages_hex"]),
                           "messages_hex": exp["messages_hex"]}, v["name"]


def test_cli_bad_lines_get_error_and_rest_still_run(tmp_path):
    good = json.dumps({"topic": "t", "user_properties": [["batch-format", "v1"], ["batch-size", "1"]],
                       "payload_hex": "0161"})
    bad_lines = ["{not json", json.dumps([1, 2]), json.dumps({"topic": 1, "user_properties": [], "payload_hex": ""}),
                 json.dumps({"topic": "t", "user_properties": [["a"]], "payload_hex": ""}),
                 json.dumps({"topic": "t", "user_properties": [], "payload_hex": "zz"})]
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


def test_cli_rejects_bad_limits():
    proc = run_cli("--max-batch-size", "0", input="")
    assert proc.returncode == 2 and "must be >= 1" in proc.stderr


# ---- issue 10: the batch-size limit is exact for any size --------------------------

@pytest.mark.parametrize("limit,size", [(10 ** 12, str(10 ** 12 + 1)), (10 ** 13, "20000000000000"),
                                        (2 ** 70, str(2 ** 70 + 1)), (2 ** 70, "1" + "0" * 5000),
                                        (10 ** 12, "9" * 13)])
def test_batch_size_over_a_large_limit_is_size_limit_exceeded(limit, size):
    res = codec.decode([("batch-format", "v1"), ("batch-size", size)], b"\x01a",
                       codec.DecodeOptions(max_batch_size=limit, max_payload_bytes=10 ** 20))
    assert (res.status, res.reason) == (codec.DISCARDED, codec.SIZE_LIMIT)
    assert f"exceeds max_batch_size {limit}" in res.log["detail"]


@pytest.mark.parametrize("limit,size", [(10 ** 12, str(10 ** 12)), (10 ** 13, "5000000000000"),
                                        (2 ** 70, str(2 ** 70))])
def test_batch_size_at_or_under_a_large_limit_is_counted_exactly(limit, size):
    res = codec.decode([("batch-format", "v1"), ("batch-size", size)], b"\x01a",
                       codec.DecodeOptions(max_batch_size=limit))
    assert (res.status, res.reason) == (codec.DISCARDED, codec.COUNT_MISMATCH)
    assert res.log["expected"] == int(size) and f"batch-size {size} but 1 sub-messages" in res.log["detail"]


def test_over_limit_batch_size_too_long_for_an_int_is_still_reported():
    size = "7" * 5000                       # beyond CPython's int/str conversion limit (4300 digits)
    res = codec.decode([("batch-format", "v1"), ("batch-size", size)], b"\x01a")
    assert res.reason == codec.SIZE_LIMIT and res.log["expected"] is None
    json.dumps(res.log)                     # the CLI writes it as JSON


# ---- issue 13: the landing table's {key, value} user properties --------------------

def test_user_properties_as_key_value_dicts_decode_like_pairs():
    import pyarrow as pa
    from mqbatch import landing
    table = landing.to_table([landing.Landed("mqbatch/d/telemetry", b"\x01a\x01b",
                                             [("batch-format", "v1"), ("batch-size", "2")], received_at_us=0)],
                             "r", 0)
    props = table.column("user_properties").to_pylist()[0]
    assert props == [{"key": "batch-format", "value": "v1"}, {"key": "batch-size", "value": "2"}]
    res = codec.decode(props, b"\x01a\x01b")
    assert (res.status, res.messages) == (codec.OK, [b"a", b"b"])
    assert isinstance(table, pa.Table)


@pytest.mark.parametrize("bad", [[{"key": "batch-format"}], [{"name": "batch-size", "value": "1"}],
                                 [{"key": "batch-format", "value": "v1", "extra": 1}]])
def test_other_dicts_are_an_invalid_property_saying_why(bad):
    res = codec.decode(bad + [("batch-size", "1")], b"\x01a")
    assert res.reason == codec.INVALID_PROPERTY
    assert "key/value" in res.log["detail"]
