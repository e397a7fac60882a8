"""Batch integrity: the HMAC-SHA256 a device puts on each batch PUBLISH as the
User Property ``batch-hmac`` (docs/format.md "Batch integrity: batch-hmac").

Pure functions, and the one writer of the keys file (`write_hmac_keys`)::

    key = parse_key(hex_text)                                   # the device's hmac_key
    name, value = sign(key, topic, user_properties, payload)    # what the device sends
    reason = verify(key, topic, user_properties, payload)       # None, or a reason code

The MAC covers the topic name, the batch-format and batch-size property values
and the payload, so none of them can be changed or moved to another device's
topic without the key. The comparison is constant-time.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import pathlib
import re
from typing import Iterable

PROPERTY = "batch-hmac"
LABEL = b"MQH1"

MISSING = "BATCH_HMAC_MISSING"  # no batch-hmac property
MALFORMED = "BATCH_HMAC_MALFORMED"  # more than one, or not 64 lowercase hex digits
INVALID = "BATCH_HMAC_INVALID"  # well-formed, but not the MAC of this batch under this key

KEY_MIN, KEY_MAX = 16, 64
HMAC_KEY_BYTES = 32  # each device's batch-hmac key as mqbatch provisions it
_HEX64 = re.compile(r"[0-9a-f]{64}")


def parse_key(text: str) -> bytes:
    """The key from its config form (hex, 16..64 bytes); ValueError says what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"hmac_key must be a hex string, got {type(text).__name__}")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError("hmac_key is not hex (2 digits per byte)") from None
    if not KEY_MIN <= len(key) <= KEY_MAX:
        raise ValueError(f"hmac_key of {len(key)} bytes: must be {KEY_MIN}..{KEY_MAX} bytes")
    return key


def _text(v) -> bytes:
    return bytes(v) if isinstance(v, (bytes, bytearray)) else str(v).encode("utf-8")


def _first(user_properties: Iterable, name: str) -> bytes:
    for k, v in user_properties or ():
        if (k.decode() if isinstance(k, (bytes, bytearray)) else k) == name:
            return _text(v)
    return b""


def _field(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError(f"field of {len(data)} bytes: at most 65535")
    return len(data).to_bytes(2, "big") + data


def message(topic, user_properties, payload) -> bytes:
    """The bytes the MAC is computed over (docs/format.md, byte by byte). The first
    batch-format and batch-size values count (absent: empty)."""
    payload = bytes(payload)
    return (
        LABEL
        + _field(_text(topic))
        + _field(_first(user_properties, "batch-format"))
        + _field(_first(user_properties, "batch-size"))
        + len(payload).to_bytes(4, "big")
        + payload
    )


def mac_hex(key: bytes, topic, user_properties, payload) -> str:
    if not KEY_MIN <= len(key) <= KEY_MAX:
        raise ValueError(f"HMAC key of {len(key)} bytes: must be {KEY_MIN}..{KEY_MAX} bytes")
    return hmac.new(key, message(topic, user_properties, payload), hashlib.sha256).hexdigest()


def sign(key: bytes, topic, user_properties, payload) -> tuple[str, str]:
    """The (name, value) User Property a device with this key sends with the batch."""
    return PROPERTY, mac_hex(key, topic, user_properties, payload)


def verify(key: bytes, topic, user_properties, payload) -> str | None:
    """None if the batch carries exactly one batch-hmac that is its MAC under key,
    else MISSING, MALFORMED or INVALID."""
    values = [
        _text(v)
        for k, v in (user_properties or ())
        if (k.decode() if isinstance(k, (bytes, bytearray)) else k) == PROPERTY
    ]
    if not values:
        return MISSING
    if len(values) > 1:
        return MALFORMED
    try:
        got = values[0].decode("ascii")
    except UnicodeDecodeError:
        return MALFORMED
    if not _HEX64.fullmatch(got):
        return MALFORMED
    want = mac_hex(key, topic, user_properties, payload)
    return None if hmac.compare_digest(got, want) else INVALID


def write_hmac_keys(path: os.PathLike | str, keys: dict[str, bytes]) -> pathlib.Path:
    """Write the --hmac-keys file ({device: hex key}, sorted) atomically, mode 0600 from
    its creation (it holds every device's secret); returns its path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
        json.dump({d: k.hex() for d, k in sorted(keys.items())}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path
