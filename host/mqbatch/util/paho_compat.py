"""One conformance fix for paho-mqtt, installed by the recorder (mqbatch.ingest.recorder).

paho-mqtt 2.1.0 refuses any UTF-8 string holding U+FEFF with MalformedPacket
("[MQTT-1.5.4-3] U+FEFF in UTF-8 data"). MQTT 5.0 section 1.5.4 says the
opposite: U+FEFF is a character like any other there, and a receiver MUST NOT
skip or strip it [MQTT-1.5.4-3]. Mosquitto forwards such a string, so one device
publishing a user property with U+FEFF raised inside paho's network thread,
which ended the thread: the recorder stopped landing anything, and after a
restart the broker redelivered the same PUBLISH from the persistent session
(tests/security/fuzz_recorder_props.py found it; tests/security/test_security_fuzz.py).

install() replaces paho's string reader with one that keeps paho's other checks
(length within the property block, valid UTF-8 — Python's strict decoder already
refuses encoded surrogates U+D800..U+DFFF [MQTT-1.5.4-1] — and no U+0000
[MQTT-1.5.4-2]) and lets U+FEFF through. It is idempotent.
"""

from __future__ import annotations

import paho.mqtt.properties as _props

PAHO_READ_UTF = _props.readUTF  # paho's own, before install() (tests show what it refuses)


def read_utf(buffer, maxlen):
    """paho's readUTF without the U+FEFF refusal: (string, bytes consumed)."""
    if maxlen < 2:
        raise _props.MalformedPacket("Not enough data to read string length")
    length = _props.readInt16(buffer)
    if length > maxlen - 2:
        raise _props.MalformedPacket("Length delimited string too long")
    text = bytes(buffer[2 : 2 + length]).decode("utf-8")  # UnicodeDecodeError for invalid UTF-8, as paho
    if "\x00" in text:
        raise _props.MalformedPacket("[MQTT-1.5.4-2] Null found in UTF-8 data")
    return text, length + 2


def install() -> None:
    _props.readUTF = read_utf  # looked up as a module global by Properties.readProperty
