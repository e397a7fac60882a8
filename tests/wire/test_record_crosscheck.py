"""Device records (firmware/mqb_record.py, run in the MicroPython Unix port)
checked byte by byte against docs/records.md with Python's struct, and
round-tripped through the host parser (host/mqbatch/wire/records.py).

The binary layout and the channel table the checks use are read from
docs/records.md itself, so a change of the document that the device does not
follow fails here.
"""

from __future__ import annotations

import json
import re
import struct

import pytest

from mqbatch.wire import codec, records
from mqbatch_testing import ROOT, run_mpy

DOC = ROOT / "docs" / "records.md"
EPOCH_2020 = 1_577_836_800

DEVICE_SCRIPT = r'''
import json, sys
from binascii import hexlify
from mqb_codec import BatchEncoder
from mqb_record import RecordWriter, TickClock

class Ticks:
    t = 0
    def ms(self):
        return self.t

with open(sys.argv[1]) as f:
    job = json.load(f)
ticks = Ticks()
clock = TickClock(ticks.ms)
enc = BatchEncoder(bytearray(16384 + 16), headroom=16, max_count=100, max_payload_bytes=16384)
w = RecordWriter(enc, clock, job["boot"], "json" if job["format"] == "json" else "binary")  # the config values
w.seq = job["first_seq"]
seqs = []
for c in job["records"]:
    clock.set(c["s"], c["ms"], c["synced"])
    fn = w.sample if c["kind"] == "sample" else w.health
    seqs.append(fn(c["channels"], c["values"]))
print(json.dumps({"payload_hex": hexlify(enc.payload()).decode(), "count": enc.count, "seqs": seqs}))
'''

# (kind, [(channel, value)], time_s, time_ms, synced)
BINARY_CASES = [
    ("sample", [(1, 2150), (2, 4500), (3, 3300)], 123_456_789, 250, True),  # the 33-byte example size
    ("sample", [(4, -127), (5, 120000), (6, 0), (1, -5000)], 0, 0, False),
    ("sample", [(1, -(1 << 31)), (2, (1 << 31) - 1)], (1 << 30) - 1, 999, True),  # i32 and time limits
    (
        "health",
        [(0x80, 81234), (0x81, 3), (0x82, 17), (0x83, 2), (0x84, -113), (0x85, 100000), (0x86, 40960)],
        217_163_200,
        123,
        True,
    ),
    ("health", [], 5, 1, False),
    ("sample", [(6, 200000)], 1000, 500, True),
]


def doc_binary_layout() -> list[tuple[int, int, str, str]]:
    """(offset, size, type, field) rows of the 'Binary record v1' table of docs/records.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Binary record v1", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (\d+|5·n) \|\s*([a-z0-9]*)\s*\| (.+?) \|$", section, re.M)
    return [(int(o), 0 if s == "5·n" else int(s), t, f) for o, s, t, f in rows]


def doc_channels() -> dict[int, str]:
    text = DOC.read_text(encoding="utf-8")
    return {int(i, 0): name for i, name in re.findall(r"^\| (0x[0-9A-Fa-f]+|\d+) \| ([a-z_]+) \|", text, re.M)}


def run_device(tmp_path, cases, fmt="binary", boot=42, first_seq=0):
    job = {
        "boot": boot,
        "format": fmt,
        "first_seq": first_seq,
        "records": [
            {"kind": k, "channels": [c for c, _ in r], "values": [v for _, v in r], "s": s, "ms": ms, "synced": syn}
            for k, r, s, ms, syn in cases
        ],
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "device.py").write_text(DEVICE_SCRIPT)
    proc = run_mpy(tmp_path / "device.py", str(tmp_path / "job.json"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    res = codec.decode([("batch-format", "v1"), ("batch-size", str(out["count"]))], bytes.fromhex(out["payload_hex"]))
    assert res.status == "ok", (res.reason, res.log)
    return res.messages, out["seqs"]


def test_doc_layout_is_what_this_test_checks():
    assert doc_binary_layout() == [
        (0, 1, "u8", "version = 1"),
        (1, 1, "u8", "kind: 1 = sample, 2 = health"),
        (2, 1, "u8", "flags: bit 0 = clock synced (NTP on boards, host clock on Unix); bits 1–7 zero"),
        (3, 1, "u8", "n = number of readings (0..32)"),
        (4, 4, "u32", "boot: the device's boot counter (persisted on flash, +1 at each boot)"),
        (
            8,
            4,
            "u32",
            "seq: sequence number within this boot, starting at 0, +1 per record (samples and health share it)",
        ),
        (12, 4, "u32", "time_s: seconds since 2020-01-01T00:00:00Z (epoch offset 1,577,836,800)"),
        (16, 2, "u16", "time_ms: milliseconds 0..999"),
        (18, 0, "", "n readings: `u8 channel`, `i32 value` (fixed point, scale by channel)"),
    ]


def test_binary_records_field_by_field(tmp_path):
    subs, seqs = run_device(tmp_path, BINARY_CASES, boot=42, first_seq=1000)
    assert len(subs) == len(BINARY_CASES) and seqs == list(range(1000, 1000 + len(BINARY_CASES)))
    fmt = {"u8": "<B", "u16": "<H", "u32": "<I"}
    layout = doc_binary_layout()
    for (kind, readings, s, ms, synced), rec, seq in zip(BINARY_CASES, subs, seqs):
        fields = {f.split(":")[0].split(" ")[0]: struct.unpack_from(fmt[t], rec, o)[0] for o, size, t, f in layout if t}
        assert fields == {
            "version": 1,
            "kind": 1 if kind == "sample" else 2,
            "flags": 1 if synced else 0,
            "n": len(readings),
            "boot": 42,
            "seq": seq,
            "time_s": s,
            "time_ms": ms,
        }, rec.hex()
        assert len(rec) == 18 + 5 * len(readings)
        got = [struct.unpack_from("<Bi", rec, 18 + 5 * i) for i in range(len(readings))]
        assert got == readings
    assert len(subs[0]) == 33  # "a sample with 3 readings: 33 bytes"


def test_json_record_reproduces_the_doc_example(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    example = re.search(r"Example: `(\{.+\})`", text).group(1)
    ex = json.loads(example)
    s, ms = divmod(ex["ts_ms"], 1000)
    channels = {v: k for k, v in doc_channels().items()}
    readings = [(channels[name], v) for name, v in ex["r"].items()]
    subs, seqs = run_device(
        tmp_path,
        [(ex["kind"], readings, s - EPOCH_2020, ms, ex["synced"])],
        fmt="json",
        boot=ex["boot"],
        first_seq=ex["seq"],
    )
    assert subs[0].decode() == example


def test_json_names_follow_the_doc_channel_table(tmp_path):
    cases = [
        ("sample", [(c, c * 10) for c in range(1, 7)], 77, 7, False),
        ("health", [(c, c) for c in range(0x80, 0x87)], 78, 8, True),
    ]
    subs, seqs = run_device(tmp_path, cases, fmt="json", boot=5)
    names = doc_channels()
    for (kind, readings, s, ms, synced), sub, seq in zip(cases, subs, seqs):
        obj = json.loads(sub)
        assert obj == {
            "v": 1,
            "kind": kind,
            "boot": 5,
            "seq": seq,
            "ts_ms": (s + EPOCH_2020) * 1000 + ms,
            "synced": synced,
            "r": {names[c]: v for c, v in readings},
        }


@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_round_trip_through_the_host_parser(tmp_path, fmt):
    in_range = [
        c
        for c in BINARY_CASES
        if all(
            records.CHANNELS[ch].low is None
            or records.CHANNELS[ch].low <= v
            and (records.CHANNELS[ch].high is None or v <= records.CHANNELS[ch].high)
            for ch, v in c[1]
        )
    ]
    assert len(in_range) == len(BINARY_CASES) - 1  # all but the i32-limits case
    subs, seqs = run_device(tmp_path, in_range, fmt=fmt, boot=9)
    for (kind, readings, s, ms, synced), sub, seq in zip(in_range, subs, seqs):
        rec = records.parse(sub)
        assert rec == records.Record(fmt, kind, synced, 9, seq, (s + EPOCH_2020) * 1000 + ms, tuple(readings))
