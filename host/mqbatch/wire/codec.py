"""Reference batch-format v1 codec (host side, CPython).

Pure functions: no I/O. `decode()` implements section 4 of the specification
with the reason codes and check order documented in docs/format.md. It never
raises on hostile input: every outcome is a DecodeResult.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

VBI_MAX = 268_435_455

FORMAT_KEY = "batch-format"
SIZE_KEY = "batch-size"
FORMAT_V1 = "v1"

OK = "ok"
PARTIAL = "partial"
DISCARDED = "discarded"

MISSING_PROPERTY = "MALFORMED_BATCH_MISSING_PROPERTY"
INVALID_PROPERTY = "MALFORMED_BATCH_INVALID_PROPERTY"
UNSUPPORTED_FORMAT = "MALFORMED_BATCH_UNSUPPORTED_FORMAT"
SIZE_LIMIT = "BATCH_SIZE_LIMIT_EXCEEDED"
PAYLOAD_LIMIT = "BATCH_PAYLOAD_LIMIT_EXCEEDED"
INVALID_LENGTH = "MALFORMED_BATCH_INVALID_LENGTH"
INCOMPLETE_PAYLOAD = "MALFORMED_BATCH_INCOMPLETE_PAYLOAD"
LENGTH_EXCEEDS = "MALFORMED_BATCH_LENGTH_EXCEEDS_PAYLOAD"
COUNT_MISMATCH = "MALFORMED_BATCH_COUNT_MISMATCH"

REASON_CODES = (
    MISSING_PROPERTY,
    INVALID_PROPERTY,
    UNSUPPORTED_FORMAT,
    SIZE_LIMIT,
    PAYLOAD_LIMIT,
    INVALID_LENGTH,
    INCOMPLETE_PAYLOAD,
    LENGTH_EXCEEDS,
    COUNT_MISMATCH,
)

_BATCH_SIZE_RE = re.compile(r"[1-9][0-9]*", re.ASCII)
_MAX_INT_DIGITS = 4300  # CPython's default int <-> str conversion limit (sys.int_info)


class EncodeError(ValueError):
    """The messages cannot form a valid v1 batch within the given limits."""


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    max_batch_size: int = 100
    max_payload_bytes: int = 65536
    allow_empty: bool = True
    partial: bool = False


@dataclasses.dataclass
class DecodeResult:
    status: str  # ok | partial | discarded
    reason: str | None  # None when ok, else one of REASON_CODES
    messages: list[bytes]  # delivered sub-messages (empty unless ok/partial)
    log: dict  # structured log record (level, topic, properties, ...)

    @property
    def count(self) -> int:
        return len(self.messages)


# -- Variable Byte Integer ---------------------------------------------------


def vbi_encode(n: int) -> bytes:
    if not 0 <= n <= VBI_MAX:
        raise ValueError(f"VBI out of range 0..{VBI_MAX}: {n}")
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _VbiError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _vbi_decode(buf: bytes, pos: int) -> tuple[int, int]:
    """Return (value, next_pos) or raise _VbiError with a batch reason code."""
    value = 0
    for i in range(4):
        if pos + i >= len(buf):
            raise _VbiError(INCOMPLETE_PAYLOAD, f"payload ends inside a length prefix at byte {pos + i}")
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if i and b == 0:
                raise _VbiError(INVALID_LENGTH, f"non-minimal {i + 1}-byte length prefix at byte {pos}")
            return value, pos + i + 1
    raise _VbiError(INVALID_LENGTH, f"length prefix at byte {pos} has a continuation bit in its 4th byte")


# -- Encoder -----------------------------------------------------------------


def encode_payload(messages: Iterable[bytes]) -> bytes:
    return b"".join(vbi_encode(len(m)) + bytes(m) for m in messages)


def encode_batch(
    messages: Sequence[bytes], max_batch_size: int = 100, max_payload_bytes: int = 65536
) -> tuple[list[tuple[str, str]], bytes]:
    """Return (user_properties, payload) for one v1 batch, enforcing the limits."""
    if not messages:
        raise EncodeError("a v1 batch needs at least one sub-message (batch-size must be positive)")
    if len(messages) > max_batch_size:
        raise EncodeError(f"{len(messages)} sub-messages exceed max_batch_size {max_batch_size}")
    payload = encode_payload(messages)
    if len(payload) > max_payload_bytes:
        raise EncodeError(f"payload of {len(payload)} bytes exceeds max_payload_bytes {max_payload_bytes}")
    return [(FORMAT_KEY, FORMAT_V1), (SIZE_KEY, str(len(messages)))], payload


# -- Decoder -----------------------------------------------------------------


def _as_str(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _pair(p) -> tuple:
    """A user property as (key, value): a pair, or a mapping with exactly the keys
    'key' and 'value' (the landing table's shape, as Arrow's to_pylist gives it)."""
    if isinstance(p, Mapping):
        if set(p) != {"key", "value"}:
            raise ValueError(f"a mapping needs exactly the keys 'key' and 'value', got {sorted(map(str, p))[:4]}")
        return p["key"], p["value"]
    return p


def _exceeds(digits: str, limit: int) -> bool:
    """Whether the decimal `digits` (no sign, no leading zero) exceed `limit`, for any length."""
    if limit < 1:
        return True
    text = str(limit)
    return (len(digits), digits) > (len(text), text)


def decode(
    user_properties,
    payload,
    options: DecodeOptions | None = None,
    topic: str | None = None,
    client_id: str | None = None,
) -> DecodeResult:
    """Validate and split one batch PUBLISH. Never raises on hostile input."""
    opts = options or DecodeOptions()
    try:
        props = [(_as_str(k), _as_str(v)) for k, v in map(_pair, user_properties or [])]
    except (TypeError, ValueError) as e:
        props = []
        bad_props: str | None = f"user properties are not key/value pairs: {e}"
    else:
        bad_props = None
    try:
        data = bytes(payload if payload is not None else b"")
    except (TypeError, ValueError):
        data = b""
    log: dict[str, Any] = {
        "topic": topic,
        "client_id": client_id,
        "properties": {
            FORMAT_KEY: [v for k, v in props if k == FORMAT_KEY],
            SIZE_KEY: [v for k, v in props if k == SIZE_KEY],
        },
        "payload_bytes": len(data),
    }

    def fail(reason: str, detail: str, status: str = DISCARDED, messages=None, level="error", **extra: Any):
        log.update(level=level, reason=reason, detail=detail, **extra)
        return DecodeResult(status, reason, messages or [], log)

    if bad_props:
        return fail(INVALID_PROPERTY, bad_props)
    formats = log["properties"][FORMAT_KEY]
    sizes = log["properties"][SIZE_KEY]
    # 1. presence (keys are case-sensitive)
    missing = [k for k, vs in ((FORMAT_KEY, formats), (SIZE_KEY, sizes)) if not vs]
    if missing:
        return fail(MISSING_PROPERTY, f"missing user property {' and '.join(missing)}")
    # 2. duplicates
    dup = [k for k, vs in ((FORMAT_KEY, formats), (SIZE_KEY, sizes)) if len(vs) > 1]
    if dup:
        return fail(INVALID_PROPERTY, f"user property {' and '.join(dup)} present more than once")
    # 3. format
    if formats[0] != FORMAT_V1:
        return fail(UNSUPPORTED_FORMAT, f"batch-format {formats[0]!r} is not supported (expected 'v1')")
    # 4. batch-size syntax
    if not _BATCH_SIZE_RE.fullmatch(sizes[0]):
        return fail(INVALID_PROPERTY, f"batch-size {sizes[0][:40]!r} is not a positive decimal integer")
    # 5. batch-size limit, compared as text: exact for any length, no int() of a hostile string
    if _exceeds(sizes[0], opts.max_batch_size):
        log["expected"] = int(sizes[0]) if len(sizes[0]) <= _MAX_INT_DIGITS else None
        return fail(SIZE_LIMIT, f"batch-size {sizes[0][:40]} exceeds max_batch_size {opts.max_batch_size}")
    expected = log["expected"] = int(sizes[0])
    # 6. payload limit
    if len(data) > opts.max_payload_bytes:
        return fail(PAYLOAD_LIMIT, f"payload of {len(data)} bytes exceeds max_payload_bytes {opts.max_payload_bytes}")
    # 7. sub-messages, in order; nothing is delivered before the whole payload is parsed
    messages: list[bytes] = []
    pos = 0
    while pos < len(data) and len(messages) < expected:
        try:
            n, start = _vbi_decode(data, pos)
        except _VbiError as e:
            return fail(e.reason, f"sub-message {len(messages) + 1}: {e.detail}")
        if n == 0 and not opts.allow_empty:
            return fail(
                INVALID_LENGTH, f"sub-message {len(messages) + 1} has length 0 and empty sub-messages are not allowed"
            )
        if n > len(data) - start:
            return fail(
                LENGTH_EXCEEDS,
                f"sub-message {len(messages) + 1} declares {n} bytes but only {len(data) - start} remain",
            )
        messages.append(data[start : start + n])
        pos = start + n
    # 8. count
    if len(messages) == expected and pos == len(data):
        log.update(level="info", reason=None, detail="ok", processed=expected)
        return DecodeResult(OK, None, messages, log)
    kind = "trailing data" if len(messages) == expected else "fewer found"
    detail = (
        f"batch-size {expected} but {len(messages)} sub-messages parsed "
        f"({kind}{f', {len(data) - pos} bytes after the last' if kind == 'trailing data' else ''})"
    )
    extra: dict[str, Any] = {"processed": len(messages), "mismatch": kind}
    if opts.partial and messages:
        return fail(
            COUNT_MISMATCH, "partial processing: " + detail, status=PARTIAL, messages=messages, level="warning", **extra
        )
    return fail(COUNT_MISMATCH, detail, **extra)
