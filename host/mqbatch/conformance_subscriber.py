"""Subscriber conformance: a generated corpus of batch PUBLISHes fed to a subscriber
under test, with the verdict each must produce (spec §3.2, §3.3, §4, §7).

The subscriber speaks the JSON Lines protocol of `mqbatch decode` (docs/format.md):
one PUBLISH per input line {"topic", "client_id", "user_properties", "payload_hex"},
one result per output line {"status", "reason", "count", "messages_hex"}, and a JSON
log record on stderr for every batch that is not "ok". Options arrive as that
command's flags (--max-batch-size N --max-payload-bytes N [--partial] [--no-empty]).

    run_corpus()                                   # the host decoder mqbatch.codec.decode, in process
    run_corpus(cmd=["mqbatch", "decode"])          # any command speaking the protocol

Per case: the verdict (ok / partial / discarded), the reason code, that a
discarded batch delivers no sub-message (a partial one only those before the
mismatch), and that the log record names the topic, the client id, both batch
properties and the reason (§4.2).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess

from mqbatch import codec
from mqbatch.conformance_wire import vbi

TOPIC = "mqbatch/sub-test/telemetry"
CLIENT_ID = "conformance-publisher-7"


@dataclasses.dataclass
class Case:
    name: str
    klass: str                # "ok", "E1".."E6", "limit", "partial", "policy"
    props: list               # [(key, value)]
    payload: bytes
    status: str               # expected ok | partial | discarded
    reason: str | None
    messages: list            # expected delivered sub-messages
    options: dict = dataclasses.field(default_factory=dict)   # decode flags: max_batch_size, ..., partial

    def line(self) -> dict:
        return {"topic": TOPIC, "client_id": CLIENT_ID, "user_properties": [list(p) for p in self.props],
                "payload_hex": self.payload.hex()}


def _b(*msgs: bytes) -> bytes:
    return b"".join(vbi(len(m)) + m for m in msgs)


def _p(size, fmt="v1"):
    out = [] if fmt is None else [("batch-format", fmt)]
    return out + ([] if size is None else [("batch-size", str(size))])


def corpus() -> list[Case]:
    D, OK, P = codec.DISCARDED, codec.OK, codec.PARTIAL
    m = [b"Msg1", b"LongerMsg2"]
    big = b"x" * 200            # 2-byte VBI
    huge = b"y" * 20000         # 3-byte VBI
    cases = [
        Case("spec-example", "ok", _p(2), _b(*m), OK, None, m),
        Case("vbi-1-2-3-byte-lengths", "ok", _p(3), _b(b"a", big, huge), OK, None, [b"a", big, huge]),
        Case("zero-length-allowed", "ok", _p(2), _b(b"", b"z"), OK, None, [b"", b"z"]),
        Case("properties-in-any-order", "ok", [("batch-size", "1"), ("x", "y"), ("batch-format", "v1")], _b(b"q"),
             OK, None, [b"q"]),
        Case("at-max-batch-size", "limit", _p(100), _b(*[b"r"] * 100), OK, None, [b"r"] * 100),
        # E1 missing / invalid properties
        Case("missing-batch-format", "E1", _p(2, None), _b(*m), D, codec.MISSING_PROPERTY, []),
        Case("missing-batch-size", "E1", _p(None), _b(*m), D, codec.MISSING_PROPERTY, []),
        Case("missing-both", "E1", [], _b(*m), D, codec.MISSING_PROPERTY, []),
        Case("batch-size-zero", "E1", _p(0), b"", D, codec.INVALID_PROPERTY, []),
        Case("batch-size-negative", "E1", _p(-2), _b(*m), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-not-a-number", "E1", _p("two"), _b(*m), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-plus-sign", "E1", _p("+2"), _b(*m), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-twice", "E1", _p(2) + [("batch-size", "2")], _b(*m), D, codec.INVALID_PROPERTY, []),
        Case("batch-format-twice", "E1", _p(2) + [("batch-format", "v1")], _b(*m), D, codec.INVALID_PROPERTY, []),
        Case("key-case-differs", "E1", [("Batch-Format", "v1"), ("batch-size", "2")], _b(*m), D,
             codec.MISSING_PROPERTY, []),
        # E2 unsupported format
        Case("format-v2", "E2", _p(2, "v2"), _b(*m), D, codec.UNSUPPORTED_FORMAT, []),
        Case("format-V1-uppercase", "E2", _p(2, "V1"), _b(*m), D, codec.UNSUPPORTED_FORMAT, []),
        # E3 invalid VBI
        Case("vbi-5-bytes", "E3", _p(2), _b(b"ok") + bytes.fromhex("ffffffff01"), D, codec.INVALID_LENGTH, []),
        Case("vbi-not-minimal", "E3", _p(2), _b(b"ok") + bytes.fromhex("8100") + b"a", D, codec.INVALID_LENGTH, []),
        Case("zero-length-disallowed", "E3", _p(2), _b(b"a", b""), D, codec.INVALID_LENGTH, [],
             {"no_empty": True}),
        # E4 length beyond the payload
        Case("length-past-end", "E4", _p(2), _b(b"ok") + vbi(50) + b"short", D, codec.LENGTH_EXCEEDS, []),
        # E5 incomplete
        Case("ends-inside-vbi", "E5", _p(2), _b(b"ok") + b"\x80", D, codec.INCOMPLETE_PAYLOAD, []),
        Case("empty-payload", "E6", _p(1), b"", D, codec.COUNT_MISMATCH, []),
        # E6 count mismatch, default: discard
        Case("fewer-found", "E6", _p(3), _b(*m), D, codec.COUNT_MISMATCH, []),
        Case("trailing-data", "E6", _p(1), _b(*m), D, codec.COUNT_MISMATCH, []),
        # E6 with partial processing enabled
        Case("partial-fewer-found", "partial", _p(3), _b(*m), P, codec.COUNT_MISMATCH, m, {"partial": True}),
        Case("partial-trailing-data", "partial", _p(1), _b(*m), P, codec.COUNT_MISMATCH, m[:1], {"partial": True}),
        Case("partial-does-not-cover-E4", "partial", _p(2), _b(b"ok") + vbi(50), D, codec.LENGTH_EXCEEDS, [],
             {"partial": True}),
        # limits (§3.3): defaults and configured
        Case("over-default-batch-size", "limit", _p(101), _b(*[b"r"] * 101), D, codec.SIZE_LIMIT, []),
        Case("over-default-payload", "limit", _p(1), _b(b"p" * 65534), D, codec.PAYLOAD_LIMIT, []),
        Case("over-configured-batch-size", "limit", _p(3), _b(b"a", b"b", b"c"), D, codec.SIZE_LIMIT, [],
             {"max_batch_size": 2}),
        Case("over-configured-payload", "limit", _p(2), _b(*m), D, codec.PAYLOAD_LIMIT, [],
             {"max_payload_bytes": 10}),
        # §7: hostile input fails safely (a verdict, no crash)
        Case("batch-size-huge-number", "E1", _p("9" * 400), _b(*m), D, codec.SIZE_LIMIT, []),
        Case("non-utf8-ish-garbage", "E3", _p(1), bytes(range(0x80, 0x90)), D, codec.INVALID_LENGTH, []),
    ]
    return cases


def _flags(opts: dict) -> list[str]:
    out = ["--max-batch-size", str(opts.get("max_batch_size", 100)),
           "--max-payload-bytes", str(opts.get("max_payload_bytes", 65536))]
    return out + (["--partial"] if opts.get("partial") else []) + (["--no-empty"] if opts.get("no_empty") else [])


def _in_process(cases: list[Case], opts: dict) -> tuple[list[dict], list[dict]]:
    options = codec.DecodeOptions(max_batch_size=opts.get("max_batch_size", 100),
                                  max_payload_bytes=opts.get("max_payload_bytes", 65536),
                                  allow_empty=not opts.get("no_empty"), partial=bool(opts.get("partial")))
    outs, logs = [], []
    for c in cases:
        res = codec.decode(c.props, c.payload, options, topic=TOPIC, client_id=CLIENT_ID)
        outs.append({"status": res.status, "reason": res.reason, "count": res.count,
                     "messages_hex": [x.hex() for x in res.messages]})
        logs.append(res.log if res.status != codec.OK else None)
    return outs, logs


def _command(cmd: list[str], cases: list[Case], opts: dict, timeout: float) -> tuple[list[dict], list[dict]]:
    """Run the command once for these cases; pair the stderr log records with the
    non-ok results in order (the protocol writes one per non-ok batch)."""
    proc = subprocess.run(cmd + _flags(opts), input="".join(json.dumps(c.line()) + "\n" for c in cases),
                          capture_output=True, text=True, timeout=timeout)
    outs = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or len(outs) != len(cases):
        raise RuntimeError(f"subscriber command {' '.join(cmd)} exited {proc.returncode} with {len(outs)} result "
                           f"lines for {len(cases)} inputs: {proc.stderr[-2000:]}")
    logs_in = []
    for x in proc.stderr.splitlines():
        try:
            logs_in.append(json.loads(x))
        except json.JSONDecodeError:
            continue            # free text on stderr is allowed; only JSON records are log records
    logs = []
    for o in outs:
        logs.append(logs_in.pop(0) if o.get("status") != "ok" and logs_in else None)
    return outs, logs


def check(case: Case, out: dict, log: dict | None) -> list[tuple[str, bool, str]]:
    """[(aspect, passed, evidence)] for one case."""
    got = [bytes.fromhex(h) for h in out.get("messages_hex", [])]
    res = [("verdict", out.get("status") == case.status, f"status {out.get('status')} (want {case.status})"),
           ("reason", out.get("reason") == case.reason, f"reason {out.get('reason')} (want {case.reason})"),
           ("delivered", got == case.messages, f"{len(got)} sub-messages delivered (want {len(case.messages)})")]
    if case.status != codec.OK:
        text = json.dumps(log) if log else ""
        props = (log or {}).get("properties", {})
        named = {"topic": TOPIC in text,
                 "batch properties": isinstance(props, dict) and "batch-format" in props and "batch-size" in props,
                 "reason code": bool(case.reason) and case.reason in text}
        missing = [k for k, v in named.items() if not v]
        res.append(("log", not missing, "log names topic, batch properties, reason code" if not missing
                    else f"log record lacks {', '.join(missing)}: {text[:300] or '(no log record)'}"))
        res.append(("log client id", CLIENT_ID in text, "log names the client id" if CLIENT_ID in text
                    else f"log record lacks the client id: {text[:300] or '(no log record)'}"))
        if case.status == codec.PARTIAL:
            ok = (log or {}).get("level") == "warning" and "processed" in (log or {}) and "mismatch" in (log or {})
            res.append(("partial warning", ok, f"level {(log or {}).get('level')}, processed "
                                               f"{(log or {}).get('processed')}, reason {(log or {}).get('mismatch')}"))
    return res


def run_corpus(cmd: list[str] | None = None, timeout: float = 60) -> list[dict]:
    """Every case with its checks: [{"case", "class", "options", "checks": [...], "passed"}]."""
    cases = corpus()
    groups: dict[str, list[Case]] = {}
    for c in cases:
        groups.setdefault(json.dumps(c.options, sort_keys=True), []).append(c)
    results = []
    for key, group in groups.items():
        opts = json.loads(key)
        outs, logs = _command(cmd, group, opts, timeout) if cmd else _in_process(group, opts)
        for c, out, log in zip(group, outs, logs):
            checks = check(c, out, log)
            results.append({"case": c.name, "class": c.klass, "options": opts, "expect": [c.status, c.reason],
                            "checks": [{"aspect": a, "passed": p, "evidence": e} for a, p, e in checks],
                            "passed": all(p for _, p, _ in checks)})
    return results
