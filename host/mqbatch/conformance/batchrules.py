"""The batch-format v1 rules on one client PUBLISH of a batch topic (no I/O): one rule id per
requirement, so one fault fails one row (docs/conformance.md).

- BATCH-FORMAT: the batch-format User Property present once, "v1" (spec §3.1 item 1);
- BATCH-SIZE: batch-size present once, a positive decimal integer (§3.1 item 2);
- BATCH-PAYLOAD: the payload parses to its end as VBI-prefixed sub-messages (§2.3, §3.1 item 3);
- BATCH-COUNT: a payload that parses holds exactly batch-size sub-messages (§3.1 item 2);
- BATCH-LIMITS: count and payload bytes within the publisher's configured limits (§3.3);
- BATCH-COMPRESSION: a compressed payload is signalled by the Content Type property, not a
  User Property, and decompresses to a well-formed batch (§8).
"""

from __future__ import annotations

import gzip
import re
import zlib

from mqbatch.conformance import packets as W

_BATCH_SIZE = re.compile(r"[1-9][0-9]*")
# payload prefixes of common compressed formats: gzip, zstd, zlib (deflate at the 3 usual levels)
_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x78\x01": "zlib",
    b"\x78\x9c": "zlib",
    b"\x78\xda": "zlib",
}
_SIGNAL_KEYS = ("compress", "encoding", "gzip", "zstd", "deflate")
MAX_INFLATED = 1 << 20  # a decompressed batch above this is not inflated further (a zip bomb is not checked)


def _magic(payload: bytes) -> str | None:
    return next((name for m, name in _MAGIC.items() if payload.startswith(m)), None)


def _inflate(kind: str, payload: bytes) -> bytes | None:
    try:
        if kind == "gzip":
            return gzip.decompress(payload)[:MAX_INFLATED]
        if kind in ("zlib", "deflate"):
            return zlib.decompressobj().decompress(payload, MAX_INFLATED)
    except (OSError, EOFError, zlib.error):
        return None
    return None  # zstd: no decoder in the standard library


def check(pkt: W.Packet, bad, limits: tuple[int, int], applied) -> int:
    """Check one batch PUBLISH; `bad(rule, text)` records a violation, `applied(rule)` counts
    a rule exercised. Returns the sub-messages counted (0 when the payload does not parse)."""
    applied("BATCH")
    formats = [v for k, v in pkt.user_props if k == "batch-format"]
    sizes = [v for k, v in pkt.user_props if k == "batch-size"]
    if formats != ["v1"]:
        bad("BATCH-FORMAT", f"batch-format User Property {formats} (must be present once, 'v1')")
    size_ok = len(sizes) == 1 and bool(_BATCH_SIZE.fullmatch(sizes[0]))
    if not size_ok:
        bad("BATCH-SIZE", f"batch-size User Property {sizes} (must be present once, a positive integer)")
    payload = pkt.fields["payload"]
    ctype = pkt.props.get(0x03) or ""
    signals = [k for k, _ in pkt.user_props if any(w in k.lower() for w in _SIGNAL_KEYS)]
    kind = next((w for w in ("gzip", "zstd", "deflate", "zlib") if w in ctype.lower()), None)
    count, problem = W.batch_payload_count(payload)
    if kind or signals or (problem and _magic(payload)):
        applied("BATCH-COMPRESSION")
        if signals:
            bad("BATCH-COMPRESSION", f"compression signalled by User Property {signals}, not Content Type (§8)")
        elif not kind:
            bad(
                "BATCH-COMPRESSION",
                f"the payload is {_magic(payload)}-compressed but Content Type is {ctype or 'absent'} (§8)",
            )
        inflated = _inflate(kind or _magic(payload) or "", payload) if (kind or problem) else None
        if inflated is None and kind and kind != "zstd":
            bad("BATCH-COMPRESSION", f"Content Type {ctype!r} but the payload does not decompress as {kind}")
        if inflated is not None:
            payload = inflated
            count, problem = W.batch_payload_count(inflated)
        elif kind or (problem and _magic(payload)):
            return 0  # compressed beyond what can be read here: reported above, the rest not checked
    if not payload:
        problem = "empty payload: a batch holds at least one sub-message"
    if problem:
        bad("BATCH-PAYLOAD", f"the payload does not parse as a batch (§2.3): {problem} (after {count} sub-messages)")
        count = 0
    elif size_ok and count != int(sizes[0]):
        bad("BATCH-COUNT", f"batch-size {sizes[0]} but the payload holds {count} sub-messages")
    max_count, max_bytes = limits
    if count > max_count or len(payload) > max_bytes:
        bad(
            "BATCH-LIMITS",
            f"{count} sub-messages, {len(payload)} payload bytes: above the configured {max_count} / {max_bytes}",
        )
    if count == max_count or len(payload) == max_bytes:
        applied("BATCH-LIMITS-REACHED")  # a batch exactly at a limit: +1 would have been caught
    return count
