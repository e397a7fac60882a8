"""Subscriber conformance: a generated corpus of batch PUBLISHes fed to a subscriber
under test, with the verdict each must produce (spec §3.2, §3.3, §4, §7).

The subscriber speaks the JSON Lines protocol of `mqbatch decode` (docs/format.md):
one PUBLISH per input line {"topic", "client_id", "user_properties", "payload_hex"},
one result per output line {"status", "reason", "count", "messages_hex"}, and a JSON
log record on stderr for every batch that is not "ok". Options arrive as that
command's flags (--max-batch-size N --max-payload-bytes N [--partial] [--no-empty]).

    run_corpus()                                   # the host decoder mqbatch.wire.codec.decode, in process
    run_corpus(cmd=["mqbatch", "decode"])          # any command speaking the protocol
    mqbatch.conformance.spark_job.run_spark(spark, dir)   # the Spark job, on the corpus as a landing zone

Per case: the verdict (ok / partial / discarded), the reason code, that a
discarded batch delivers no sub-message (a partial one only those before the
mismatch), and that the log record names the topic, the client id, both batch
properties and the reason (§4.2). An aspect a subscriber cannot meet by design is
reported as not applicable with the reason (check(client_id_absent=...)), never as
a pass. The corpus's sub-messages are valid mqbatch records where the case allows,
so a subscriber that delivers from a discarded batch lands real records.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

from mqbatch.conformance.packets import vbi
from mqbatch.wire import codec, records

TOPIC = "mqbatch/sub-test/telemetry"
CLIENT_ID = "conformance-publisher-7"


@dataclasses.dataclass
class Case:
    name: str
    klass: str  # "ok", "E1".."E6", "limit", "partial", "policy"
    props: list  # [(key, value)]
    payload: bytes
    status: str  # expected ok | partial | discarded
    reason: str | None
    messages: list  # expected delivered sub-messages
    options: dict = dataclasses.field(default_factory=dict)  # decode flags: max_batch_size, ..., partial

    def line(self) -> dict:
        return {
            "topic": TOPIC,
            "client_id": CLIENT_ID,
            "user_properties": [list(p) for p in self.props],
            "payload_hex": self.payload.hex(),
        }


def _b(*msgs: bytes) -> bytes:
    return b"".join(vbi(len(m)) + m for m in msgs)


def _p(size, fmt="v1"):
    out = [] if fmt is None else [("batch-format", fmt)]
    return out + ([] if size is None else [("batch-size", str(size))])


T0_MS = 1_795_000_000_000  # device clock of the corpus records (2026-11-18T11:06:40Z)


def _record_maker():
    """fresh(n): n valid mqbatch binary records, each with its own seq. With real records
    in the corpus, a subscriber that wrongly delivers a sub-message of a discarded batch
    lands a real record (the Spark job's records/), not bytes it would reject anyway."""
    seq = [0]

    def fresh(n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            seq[0] += 1
            out.append(records.encode_binary("sample", 1, seq[0], T0_MS + seq[0] * 1000, [(1, 2150), (3, 3300)]))
        return out

    return fresh


def corpus() -> list[Case]:
    D, OK, P = codec.DISCARDED, codec.OK, codec.PARTIAL
    R = _record_maker()
    spec = [b"Msg1", b"LongerMsg2"]  # the spec's example
    big = b"x" * 200  # 2-byte VBI
    huge = b"y" * 20000  # 3-byte VBI
    cases = [
        Case("spec-example", "ok", _p(2), _b(*spec), OK, None, spec),
        Case("vbi-1-2-3-byte-lengths", "ok", _p(3), _b(b"a", big, huge), OK, None, [b"a", big, huge]),
        Case("zero-length-allowed", "ok", _p(2), _b(b"", b"z"), OK, None, [b"", b"z"]),
        Case(
            "properties-in-any-order",
            "ok",
            [("batch-size", "2"), ("x", "y"), ("batch-format", "v1")],
            _b(*(m := R(2))),
            OK,
            None,
            m,
        ),
        Case("at-max-batch-size", "limit", _p(100), _b(*(m := R(100))), OK, None, m),
        # E1 missing / invalid properties
        Case("missing-batch-format", "E1", _p(2, None), _b(*R(2)), D, codec.MISSING_PROPERTY, []),
        Case("missing-batch-size", "E1", _p(None), _b(*R(2)), D, codec.MISSING_PROPERTY, []),
        Case("missing-both", "E1", [], _b(*R(2)), D, codec.MISSING_PROPERTY, []),
        Case("batch-size-zero", "E1", _p(0), b"", D, codec.INVALID_PROPERTY, []),
        Case("batch-size-negative", "E1", _p(-2), _b(*R(2)), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-not-a-number", "E1", _p("two"), _b(*R(2)), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-plus-sign", "E1", _p("+2"), _b(*R(2)), D, codec.INVALID_PROPERTY, []),
        Case("batch-size-twice", "E1", _p(2) + [("batch-size", "2")], _b(*R(2)), D, codec.INVALID_PROPERTY, []),
        Case("batch-format-twice", "E1", _p(2) + [("batch-format", "v1")], _b(*R(2)), D, codec.INVALID_PROPERTY, []),
        Case(
            "key-case-differs",
            "E1",
            [("Batch-Format", "v1"), ("batch-size", "2")],
            _b(*R(2)),
            D,
            codec.MISSING_PROPERTY,
            [],
        ),
        # E2 unsupported format
        Case("format-v2", "E2", _p(2, "v2"), _b(*R(2)), D, codec.UNSUPPORTED_FORMAT, []),
        Case("format-V1-uppercase", "E2", _p(2, "V1"), _b(*R(2)), D, codec.UNSUPPORTED_FORMAT, []),
        # E3 invalid VBI
        Case("vbi-5-bytes", "E3", _p(2), _b(*R(1)) + bytes.fromhex("ffffffff01"), D, codec.INVALID_LENGTH, []),
        Case("vbi-not-minimal", "E3", _p(2), _b(*R(1)) + bytes.fromhex("8100") + b"a", D, codec.INVALID_LENGTH, []),
        Case("zero-length-disallowed", "E3", _p(2), _b(*R(1), b""), D, codec.INVALID_LENGTH, [], {"no_empty": True}),
        # E4 length beyond the payload
        Case("length-past-end", "E4", _p(2), _b(*R(1)) + vbi(50) + b"short", D, codec.LENGTH_EXCEEDS, []),
        # E5 incomplete
        Case("ends-inside-vbi", "E5", _p(2), _b(*R(1)) + b"\x80", D, codec.INCOMPLETE_PAYLOAD, []),
        Case("empty-payload", "E6", _p(1), b"", D, codec.COUNT_MISMATCH, []),
        # E6 count mismatch, default: discard
        Case("fewer-found", "E6", _p(3), _b(*R(2)), D, codec.COUNT_MISMATCH, []),
        Case("trailing-data", "E6", _p(1), _b(*R(2)), D, codec.COUNT_MISMATCH, []),
        # E6 with partial processing enabled
        Case("partial-fewer-found", "partial", _p(3), _b(*(m := R(2))), P, codec.COUNT_MISMATCH, m, {"partial": True}),
        Case(
            "partial-trailing-data",
            "partial",
            _p(1),
            _b(*(m := R(2))),
            P,
            codec.COUNT_MISMATCH,
            m[:1],
            {"partial": True},
        ),
        Case(
            "partial-does-not-cover-E4",
            "partial",
            _p(2),
            _b(*R(1)) + vbi(50),
            D,
            codec.LENGTH_EXCEEDS,
            [],
            {"partial": True},
        ),
        # limits (§3.3): defaults and configured
        Case("over-default-batch-size", "limit", _p(101), _b(*R(101)), D, codec.SIZE_LIMIT, []),
        Case("over-default-payload", "limit", _p(1), _b(b"p" * 65534), D, codec.PAYLOAD_LIMIT, []),
        Case("over-configured-batch-size", "limit", _p(3), _b(*R(3)), D, codec.SIZE_LIMIT, [], {"max_batch_size": 2}),
        Case(
            "over-configured-payload", "limit", _p(2), _b(*R(2)), D, codec.PAYLOAD_LIMIT, [], {"max_payload_bytes": 10}
        ),
        # §7: hostile input fails safely (a verdict, no crash)
        Case("batch-size-huge-number", "E1", _p("9" * 400), _b(*R(2)), D, codec.SIZE_LIMIT, []),
        Case("non-utf8-ish-garbage", "E3", _p(1), bytes(range(0x80, 0x90)), D, codec.INVALID_LENGTH, []),
    ]
    return cases


def _flags(opts: dict) -> list[str]:
    out = [
        "--max-batch-size",
        str(opts.get("max_batch_size", 100)),
        "--max-payload-bytes",
        str(opts.get("max_payload_bytes", 65536)),
    ]
    return out + (["--partial"] if opts.get("partial") else []) + (["--no-empty"] if opts.get("no_empty") else [])


def _in_process(cases: list[Case], opts: dict) -> tuple[list[dict], list[dict]]:
    options = codec.DecodeOptions(
        max_batch_size=opts.get("max_batch_size", 100),
        max_payload_bytes=opts.get("max_payload_bytes", 65536),
        allow_empty=not opts.get("no_empty"),
        partial=bool(opts.get("partial")),
    )
    outs, logs = [], []
    for c in cases:
        res = codec.decode(c.props, c.payload, options, topic=TOPIC, client_id=CLIENT_ID)
        outs.append(
            {
                "status": res.status,
                "reason": res.reason,
                "count": res.count,
                "messages_hex": [x.hex() for x in res.messages],
            }
        )
        logs.append(res.log if res.status != codec.OK else None)
    return outs, logs


def _command(cmd: list[str], cases: list[Case], opts: dict, timeout: float) -> tuple[list[dict], list[dict]]:
    """Run the command once for these cases; pair the stderr log records with the
    non-ok results in order (the protocol writes one per non-ok batch)."""
    proc = subprocess.run(
        cmd + _flags(opts),
        input="".join(json.dumps(c.line()) + "\n" for c in cases),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    outs = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or len(outs) != len(cases):
        raise RuntimeError(
            f"subscriber command {' '.join(cmd)} exited {proc.returncode} with {len(outs)} result "
            f"lines for {len(cases)} inputs: {proc.stderr[-2000:]}"
        )
    logs_in = []
    for x in proc.stderr.splitlines():
        try:
            logs_in.append(json.loads(x))
        except json.JSONDecodeError:
            continue  # free text on stderr is allowed; only JSON records are log records
    logs = []
    for o in outs:
        logs.append(logs_in.pop(0) if o.get("status") != "ok" and logs_in else None)
    return outs, logs


NOT_APPLICABLE = "not applicable"


def _partial_from_log(case: Case, log: dict | None) -> tuple[bool, str]:
    """The §4.2 partial warning in a `mqbatch decode`-style log record."""
    log = log or {}
    ok = log.get("level") == "warning" and log.get("processed") == len(case.messages) and "mismatch" in log
    return ok, f"level {log.get('level')}, processed {log.get('processed')}, reason {log.get('mismatch')}"


def check(
    case: Case, out: dict, log: dict | None, client_id_absent: str | None = None, partial_check=_partial_from_log
) -> list[tuple[str, bool | None, str]]:
    """[(aspect, passed, evidence)] for one case. passed is None for an aspect that does
    not apply to this subscriber, with the reason as evidence: `client_id_absent` says why
    the subscriber cannot know the publisher's client id (then the "log client id"
    aspect is reported as not applicable, never as a pass). `partial_check(case, log)`
    reads the partial-processing warning from the subscriber's log record."""
    got = [bytes.fromhex(h) for h in out.get("messages_hex", [])]
    res = [
        ("verdict", out.get("status") == case.status, f"status {out.get('status')} (want {case.status})"),
        ("reason", out.get("reason") == case.reason, f"reason {out.get('reason')} (want {case.reason})"),
        (
            "delivered",
            got == case.messages,
            f"{len(got)} sub-messages delivered (want {len(case.messages)})"
            + ("" if got == case.messages or len(got) != len(case.messages) else ", with other bytes"),
        ),
    ]
    if case.status != codec.OK:
        text = json.dumps(log, default=str) if log else ""
        props = (log or {}).get("properties")
        # the values of both batch properties exactly as published ([] when absent or in another case)
        want = {k: [v for key, v in case.props if key == k] for k in ("batch-format", "batch-size")}
        named = {
            "topic": TOPIC in text,
            "batch properties": isinstance(props, dict) and all(props.get(k, []) == v for k, v in want.items()),
            "reason code": bool(case.reason) and case.reason in text,
        }
        missing = [k for k, v in named.items() if not v]
        res.append(
            (
                "log",
                not missing,
                "log names topic, batch properties, reason code"
                if not missing
                else f"log record lacks {', '.join(missing)}: {text[:300] or '(no log record)'}",
            )
        )
        if client_id_absent:
            res.append(("log client id", None, f"{NOT_APPLICABLE}: {client_id_absent}"))
        else:
            res.append(
                (
                    "log client id",
                    CLIENT_ID in text,
                    "log names the client id"
                    if CLIENT_ID in text
                    else f"log record lacks the client id: {text[:300] or '(no log record)'}",
                )
            )
        if case.status == codec.PARTIAL:
            res.append(("partial warning", *partial_check(case, log)))
    return res


def result(case: Case, opts: dict, checks: list[tuple[str, bool | None, str]]) -> dict:
    """One case's entry of a run: {"case", "class", "options", "expect", "checks", "passed"};
    each check {"aspect", "passed" (None: not applicable), "evidence"}. The case passes
    when no applicable aspect failed."""
    return {
        "case": case.name,
        "class": case.klass,
        "options": opts,
        "expect": [case.status, case.reason],
        "checks": [{"aspect": a, "passed": p, "evidence": e} for a, p, e in checks],
        "passed": all(p is not False for _, p, _ in checks),
    }


def groups() -> dict[str, list[Case]]:
    """The corpus by decoder options (a JSON key): one subscriber run per group."""
    out: dict[str, list[Case]] = {}
    for c in corpus():
        out.setdefault(json.dumps(c.options, sort_keys=True), []).append(c)
    return out


def run_corpus(cmd: list[str] | None = None, timeout: float = 60) -> list[dict]:
    """Every case with its checks (see result())."""
    results = []
    for key, group in groups().items():
        opts = json.loads(key)
        outs, logs = _command(cmd, group, opts, timeout) if cmd else _in_process(group, opts)
        results += [result(c, opts, check(c, out, log)) for c, out, log in zip(group, outs, logs)]
    return results
