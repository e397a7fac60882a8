#!/usr/bin/env python3
"""Generate tests/vectors/batch_v1.json, the shared batch-format v1 test vectors.

Every length prefix below is written out literally (not computed by the codec
under test), so the vectors check the codecs rather than echo them.
Run: .venv/bin/python tools/gen_vectors.py
"""

import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "vectors" / "batch_v1.json"
F, S = "batch-format", "batch-size"
R = {
    k: "MALFORMED_BATCH_" + k
    for k in (
        "MISSING_PROPERTY",
        "INVALID_PROPERTY",
        "UNSUPPORTED_FORMAT",
        "INVALID_LENGTH",
        "INCOMPLETE_PAYLOAD",
        "LENGTH_EXCEEDS_PAYLOAD",
        "COUNT_MISMATCH",
    )
}
SIZE_LIMIT, PAYLOAD_LIMIT = "BATCH_SIZE_LIMIT_EXCEEDED", "BATCH_PAYLOAD_LIMIT_EXCEEDED"

vectors = []


def props(n, fmt="v1"):
    return [[F, fmt], [S, str(n)]]


def valid(name, chunks, messages, extra_props=None, options=None, note=""):
    """chunks: the payload written out as literal prefix bytes + data."""
    payload = b"".join(chunks)
    p = props(len(messages))
    if extra_props:
        p = extra_props[:1] + p + extra_props[1:]
    vectors.append(
        {
            "name": name,
            "note": note,
            "user_properties": p,
            "payload_hex": payload.hex(),
            "options": options or {},
            "encode": True,
            "expect": {"status": "ok", "reason": None, "messages_hex": [m.hex() for m in messages]},
        }
    )


def bad(name, user_properties, payload, reason, options=None, status="discarded", messages=(), note=""):
    vectors.append(
        {
            "name": name,
            "note": note,
            "user_properties": user_properties,
            "payload_hex": payload.hex(),
            "options": options or {},
            "encode": False,
            "expect": {"status": status, "reason": reason, "messages_hex": [m.hex() for m in messages]},
        }
    )


# ---- valid ------------------------------------------------------------------
valid("spec_2_4_example", [b"\x04Msg1", b"\x0aLongerMsg2"], [b"Msg1", b"LongerMsg2"], note="specification section 2.4")
valid("single_one_byte", [b"\x01\x00"], [b"\x00"])
for n, prefix in ((127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01")):
    body = bytes((i * 7 + n) & 0xFF for i in range(n))
    valid(f"boundary_{n}", [prefix, body, b"\x02ok"], [body, b"ok"], note=f"{len(prefix)}-byte length prefix")
valid("zero_length_submessages", [b"\x00", b"\x01a", b"\x00"], [b"", b"a", b""])
valid("all_zero_length", [b"\x00\x00\x00"], [b"", b"", b""])
hundred = [bytes([i]) * (i % 24) for i in range(100)]
valid("count_100", [bytes([len(m)]) + m for m in hundred], hundred, note="default max_batch_size")
big = bytes(i & 0xFF for i in range(65536 - 3))
valid("payload_exactly_65536", [b"\xfd\xff\x03", big], [big], note="3-byte prefix + 65533 = 65536")
valid(
    "other_user_properties_kept",
    [b"\x03abc"],
    [b"abc"],
    extra_props=[["device", "d1"], ["Batch-Format", "v9"], [S + " ", "x"]],
    note="other properties (including case variants of the keys) are ignored",
)
valid("binary_submessages", [b"\x04\xff\x00\x80\x7f", b"\x02\x0a\x0d"], [b"\xff\x00\x80\x7f", b"\x0a\x0d"])

# ---- 1. missing property ------------------------------------------------------
bad("missing_format", [[S, "1"]], b"\x01a", R["MISSING_PROPERTY"])
bad("missing_size", [[F, "v1"]], b"\x01a", R["MISSING_PROPERTY"])
bad("missing_both", [], b"\x01a", R["MISSING_PROPERTY"])
bad("keys_are_case_sensitive", [["Batch-Format", "v1"], ["batch-size", "1"]], b"\x01a", R["MISSING_PROPERTY"])
bad("missing_beats_unsupported", [[F, "v2"]], b"", R["MISSING_PROPERTY"], note="check 1 before check 3")
# ---- 2. duplicates --------------------------------------------------------------
bad("duplicate_format", [[F, "v1"], [S, "1"], [F, "v1"]], b"\x01a", R["INVALID_PROPERTY"])
bad("duplicate_size", [[F, "v1"], [S, "1"], [S, "1"]], b"\x01a", R["INVALID_PROPERTY"])
bad("duplicate_beats_unsupported", [[F, "v2"], [F, "v1"], [S, "1"]], b"\x01a", R["INVALID_PROPERTY"])
# ---- 3. format ------------------------------------------------------------------
for i, fmt in enumerate(["v2", "V1", "", "v1 ", "1"]):
    bad(f"unsupported_format_{i}", props(1, fmt), b"\x01a", R["UNSUPPORTED_FORMAT"], note=repr(fmt))
bad("unsupported_beats_bad_size", [[F, "v2"], [S, "zero"]], b"\x01a", R["UNSUPPORTED_FORMAT"])
# ---- 4. batch-size syntax -------------------------------------------------------
for i, size in enumerate(["0", "-1", "01", "1.0", " 1", "1 ", "+1", "abc", "", "1\n", "\u0661", "0x1", "1e2"]):
    bad(f"bad_batch_size_{i}", [[F, "v1"], [S, size]], b"\x01a", R["INVALID_PROPERTY"], note=repr(size))
bad(
    "bad_size_beats_payload_limit",
    [[F, "v1"], [S, "x"]],
    b"\x01a" * 10,
    R["INVALID_PROPERTY"],
    options={"max_payload_bytes": 4},
)
# ---- 5. batch-size limit --------------------------------------------------------
bad("size_101_over_default", props(101), b"\x01a" * 101, SIZE_LIMIT)
bad("size_limit_option", props(6), b"\x01a" * 6, SIZE_LIMIT, options={"max_batch_size": 5})
bad("size_huge", [[F, "v1"], [S, "9" * 5000]], b"\x01a", SIZE_LIMIT)
bad(
    "size_limit_beats_payload_limit",
    props(6),
    b"\x01a" * 6,
    SIZE_LIMIT,
    options={"max_batch_size": 5, "max_payload_bytes": 4},
)
valid("size_at_limit_option", [b"\x01a"] * 5, [b"a"] * 5, options={"max_batch_size": 5})
# ---- 6. payload limit -----------------------------------------------------------
bad("payload_65537_over_default", props(1), b"\xfe\xff\x03" + bytes(65534), PAYLOAD_LIMIT)
bad("payload_limit_option", props(2), b"\x03abc\x03def", PAYLOAD_LIMIT, options={"max_payload_bytes": 7})
bad("payload_limit_beats_bad_vbi", props(1), b"\xff\xff\xff\xff\x01", PAYLOAD_LIMIT, options={"max_payload_bytes": 4})
valid("payload_at_limit_option", [b"\x03abc", b"\x02de"], [b"abc", b"de"], options={"max_payload_bytes": 7})
# ---- 7. sub-message parsing -----------------------------------------------------
bad("vbi_five_bytes", props(1), b"\xff\xff\xff\xff\x01" + b"a", R["INVALID_LENGTH"])
bad("vbi_non_minimal_2", props(1), b"\x80\x00", R["INVALID_LENGTH"])
bad("vbi_non_minimal_3", props(1), b"\x81\x80\x00" + b"a", R["INVALID_LENGTH"])
bad("vbi_bad_after_good", props(3), b"\x01a\x80\x00\x01b", R["INVALID_LENGTH"])
bad("zero_length_disallowed", props(2), b"\x01a\x00", R["INVALID_LENGTH"], options={"allow_empty": False})
bad("incomplete_vbi", props(1), b"\x80", R["INCOMPLETE_PAYLOAD"])
bad("incomplete_vbi_after_message", props(2), b"\x04Msg1\x85", R["INCOMPLETE_PAYLOAD"])
bad("incomplete_vbi_three_bytes", props(1), b"\xff\xff\xff", R["INCOMPLETE_PAYLOAD"])
bad("length_exceeds", props(1), b"\x05abc", R["LENGTH_EXCEEDS_PAYLOAD"])
bad("length_exceeds_second", props(2), b"\x01a\x0aabc", R["LENGTH_EXCEEDS_PAYLOAD"])
bad("length_exceeds_huge", props(1), b"\xff\xff\xff\x7f", R["LENGTH_EXCEEDS_PAYLOAD"])
bad(
    "partial_does_not_rescue_invalid_length", props(3), b"\x01a\x80\x00", R["INVALID_LENGTH"], options={"partial": True}
)
bad(
    "partial_does_not_rescue_length_exceeds",
    props(3),
    b"\x01a\x05b",
    R["LENGTH_EXCEEDS_PAYLOAD"],
    options={"partial": True},
)
# ---- 8. count mismatch ----------------------------------------------------------
bad("fewer_found", props(3), b"\x01a\x01b", R["COUNT_MISMATCH"])
bad("trailing_data", props(1), b"\x01a\x01b", R["COUNT_MISMATCH"])
bad(
    "trailing_garbage",
    props(1),
    b"\x01a\xff",
    R["COUNT_MISMATCH"],
    note="bytes after the Nth sub-message are trailing data, not parsed",
)
bad("empty_payload", props(1), b"", R["COUNT_MISMATCH"])
bad(
    "partial_fewer",
    props(3),
    b"\x01a\x01b",
    R["COUNT_MISMATCH"],
    options={"partial": True},
    status="partial",
    messages=[b"a", b"b"],
)
bad(
    "partial_trailing",
    props(2),
    b"\x01a\x01b\x01c",
    R["COUNT_MISMATCH"],
    options={"partial": True},
    status="partial",
    messages=[b"a", b"b"],
)
bad("partial_nothing_found", props(2), b"", R["COUNT_MISMATCH"], options={"partial": True})

OUT.parent.mkdir(parents=True, exist_ok=True)
OUT.write_text(
    json.dumps(
        {
            "format": "batch-v1 test vectors",
            "reason_order": [
                R["MISSING_PROPERTY"],
                R["INVALID_PROPERTY"] + " (duplicate)",
                R["UNSUPPORTED_FORMAT"],
                R["INVALID_PROPERTY"] + " (syntax)",
                SIZE_LIMIT,
                PAYLOAD_LIMIT,
                R["INVALID_LENGTH"] + " / " + R["INCOMPLETE_PAYLOAD"] + " / " + R["LENGTH_EXCEEDS_PAYLOAD"],
                R["COUNT_MISMATCH"],
            ],
            "vectors": vectors,
        },
        indent=1,
    )
    + "\n",
    encoding="utf-8",
)
print(f"wrote {len(vectors)} vectors to {OUT}")
