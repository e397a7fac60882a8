"""The job's batch-hmac check (`--hmac-keys`), one pure function shared by both decoders
(the reference mqbatch.spark.decoder and mqbatch.spark.vdecode): per landed PUBLISH, before
any structural decoding. No pyspark, no I/O.

    check(keys, topic, user_properties, payload) -> None | (reason, detail)

`keys` is JobOptions.hmac_keys: None (the check is off) or ((device, key bytes), ...).
Only a topic that names a device (records.device_from_topic) is checked; any other
topic is left to the topic check. Reasons: integrity's BATCH_HMAC_MISSING / MALFORMED /
INVALID, and NO_KEY for a device the keys file does not hold (docs/spark.md)."""

from __future__ import annotations

from mqbatch.wire import integrity, records

NO_KEY = "BATCH_HMAC_NO_KEY"  # the topic's device has no key in --hmac-keys
REASONS = (integrity.MISSING, integrity.MALFORMED, integrity.INVALID, NO_KEY)

_DETAIL = {
    integrity.MISSING: "no batch-hmac user property (an unsigned batch)",
    integrity.MALFORMED: "batch-hmac is repeated or not 64 lowercase hex digits",
    integrity.INVALID: "batch-hmac is not the HMAC-SHA256 of this topic, batch-format, batch-size and payload",
}


_MAP: tuple = ((), {})  # the last keys tuple seen and its dict


def _key_map(pairs: tuple) -> dict:
    """{device: key} of the keys tuple, built once per tuple object: a cache keyed by the
    tuple's value (functools.lru_cache) hashed all of it on every call, 174 us per PUBLISH
    with 10,000 devices."""
    global _MAP
    seen, mapping = _MAP
    if seen is not pairs:
        mapping = dict(pairs)
        _MAP = (pairs, mapping)
    return mapping


def check(keys, topic, user_properties, payload) -> tuple[str, str] | None:
    """None if the check is off, the topic names no device, or the batch's MAC verifies
    under its device's key; else (reason, detail)."""
    if keys is None:
        return None
    try:
        device = records.device_from_topic(topic)
    except records.RecordError:
        return None
    key = _key_map(keys).get(device)
    if key is None:
        return NO_KEY, f"device {device!r} has no key in the --hmac-keys file: its batches cannot be verified"
    try:
        reason = integrity.verify(key, topic, user_properties, payload)
    except ValueError as e:  # a property value over 65535 bytes: no device can have signed it
        return integrity.INVALID, f"batch of device {device!r} cannot carry a valid batch-hmac: {e}"
    if reason is None:
        return None
    return reason, f"{_DETAIL[reason]} (device {device!r}, {len(payload)}-byte payload)"
