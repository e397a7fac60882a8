"""`mqbatch decode`: run the reference decoder over JSON Lines of PUBLISHes.

Input line:  {"topic": str, "user_properties": [[key, value], ...], "payload_hex": str,
              "client_id": str (optional: the publisher's client id, put in the log record)}
Output line: {"status": ok|partial|discarded|error, "reason": null|CODE, "count": int, "messages_hex": [...]}
A line that is not of that shape gets status "error" with an "error" message;
the other lines still run. Decoder log records for non-ok batches go to stderr
as JSON Lines.
"""

from __future__ import annotations

import argparse
import json
import sys

from mqbatch.util.argtypes import positive_int
from mqbatch.wire import codec

_positive = positive_int  # the old name, still imported by spark_jobs/telemetry_args.py


class InputError(ValueError):
    pass


def parse_line(line: str) -> tuple[str, list[tuple[str, str]], bytes, str | None]:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:  # ValueError: bad JSON, or an int over Python's digit limit
        raise InputError(f"not valid JSON: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object")
    topic = obj.get("topic")
    if not isinstance(topic, str):
        raise InputError("'topic' must be a string")
    props = obj.get("user_properties")
    if not isinstance(props, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in props
    ):
        raise InputError("'user_properties' must be a list of [key, value] string pairs")
    payload_hex = obj.get("payload_hex")
    if not isinstance(payload_hex, str):
        raise InputError("'payload_hex' must be a string")
    try:
        payload = bytes.fromhex(payload_hex)
    except ValueError as e:
        raise InputError(f"'payload_hex' is not hexadecimal: {e}") from None
    client_id = obj.get("client_id")
    if client_id is not None and not isinstance(client_id, str):
        raise InputError("'client_id' must be a string (or absent)")
    return topic, [(k, v) for k, v in props], payload, client_id


def decode_line(line: str, options: codec.DecodeOptions) -> tuple[dict, dict | None]:
    """Return (output record, log record or None)."""
    try:
        topic, props, payload, client_id = parse_line(line)
    except InputError as e:
        return {"status": "error", "reason": None, "count": 0, "messages_hex": [], "error": str(e)}, None
    res = codec.decode(props, payload, options, topic=topic, client_id=client_id)
    out = {
        "status": res.status,
        "reason": res.reason,
        "count": res.count,
        "messages_hex": [m.hex() for m in res.messages],
    }
    return out, (res.log if res.status != codec.OK else None)


def run(args: argparse.Namespace) -> int:
    options = codec.DecodeOptions(
        max_batch_size=args.max_batch_size,
        max_payload_bytes=args.max_payload_bytes,
        allow_empty=not args.no_empty,
        partial=args.partial,
    )
    try:
        stream = open(args.file, encoding="utf-8") if args.file else sys.stdin
    except OSError as e:
        print(f"decode: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        for line in stream:
            if not line.strip():
                continue
            out, log = decode_line(line, options)
            sys.stdout.write(json.dumps(out) + "\n")
            if log is not None:
                sys.stderr.write(json.dumps(log) + "\n")
    finally:
        if stream is not sys.stdin:
            stream.close()
    return 0


def register(sub) -> None:
    p = sub.add_parser("decode", help="decode batch PUBLISHes given as JSON Lines")
    p.add_argument("file", nargs="?", metavar="FILE", help="JSON Lines input (default: stdin)")
    p.add_argument("--max-batch-size", type=positive_int, default=100)
    p.add_argument("--max-payload-bytes", type=positive_int, default=65536)
    p.add_argument("--partial", action="store_true", help="deliver sub-messages parsed before a count mismatch")
    p.add_argument("--no-empty", action="store_true", help="reject zero-length sub-messages")
    p.set_defaults(func=run)
