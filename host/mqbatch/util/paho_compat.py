"""paho-mqtt work-arounds, installed by the recorder (mqbatch.ingest.recorder): one
conformance fix and one faster parser. install() applies both; it is idempotent.

**U+FEFF.** paho-mqtt 2.1.0 refuses any UTF-8 string holding U+FEFF with MalformedPacket
("[MQTT-1.5.4-3] U+FEFF in UTF-8 data"). MQTT 5.0 section 1.5.4 says the
opposite: U+FEFF is a character like any other there, and a receiver MUST NOT
skip or strip it [MQTT-1.5.4-3]. Mosquitto forwards such a string, so one device
publishing a user property with U+FEFF raised inside paho's network thread,
which ended the thread: the recorder stopped landing anything, and after a
restart the broker redelivered the same PUBLISH from the persistent session
(tests/security/fuzz_recorder_props.py found it; tests/security/test_security_fuzz.py).
read_utf replaces paho's string reader with one that keeps paho's other checks
(length within the property block, valid UTF-8 — Python's strict decoder already
refuses encoded surrogates U+D800..U+DFFF [MQTT-1.5.4-1] — and no U+0000
[MQTT-1.5.4-2]) and lets U+FEFF through.

**PUBLISH properties, parsed once per message without paho's per-property overhead.**
paho builds a Properties object for every incoming PUBLISH and fills it through
``__setattr__``, which looks each name up by scanning all 27 names with
``str.replace`` (about 100 calls per user property) and copies the rest of the packet,
payload included, after each property. That was about half of a counting paho
subscriber's CPU per 3.4 kB batch (docs/ingest.md). publish_unpack parses a PUBLISH
property block in one pass over indices and sets the same attributes to the same
values; anything it does not accept as plainly well-formed (an identifier not allowed
on a PUBLISH, a property running past its block, a repeated single property, a value
paho's setter refuses, invalid UTF-8...) is handed to paho's own unpack from the start,
so what paho refuses, and how, is unchanged. fast_init builds a Properties without
recomputing paho's constant tables. Differential test against paho's own code:
tests/security/test_security_fuzz.py (fuzz_recorder_props.py --differential).
"""

from __future__ import annotations

from typing import Any

import paho.mqtt
import paho.mqtt.properties as _props
from paho.mqtt.packettypes import PacketTypes

PAHO_READ_UTF = _props.readUTF  # paho's own, before install() (tests show what it refuses)
PAHO_UNPACK = _props.Properties.unpack
PAHO_INIT = _props.Properties.__init__


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


# -- the PUBLISH property parser -------------------------------------------------------

_PROTO = _props.Properties(PacketTypes.PUBLISH)  # paho's constant tables, as its __init__ builds them
_TYPES = tuple(_PROTO.types)
_NAMES = dict(_PROTO.names)  # "Payload Format Indicator" -> 1 ...
_PROPERTIES = dict(_PROTO.properties)  # ident -> (type, [packet types]); paho never changes these lists
_BYTE, _INT2, _INT4, _VBI, _BINARY, _UTF8, _PAIR = (
    _TYPES.index(t)
    for t in (
        "Byte",
        "Two Byte Integer",
        "Four Byte Integer",
        "Variable Byte Integer",
        "Binary Data",
        "UTF-8 Encoded String",
        "UTF-8 String Pair",
    )
)
# paho's __setattr__ refuses these values of a single (non-list) property
_RANGES = {
    "ReceiveMaximum": (1, 65535),
    "TopicAlias": (1, 65535),
    "TopicAliasMaximum": (0, 65535),
    "MaximumPacketSize": (1, 268435455),
    "SubscriptionIdentifier": (1, 268435455),
    "RequestResponseInformation": (0, 1),
    "RequestProblemInformation": (0, 1),
    "PayloadFormatIndicator": (0, 1),
}
# identifier -> (attribute name, value type, repeatable, (lo, hi) or None), for those allowed on a PUBLISH
_ATTRIBUTES = tuple(name.replace(" ", "") for name in _NAMES)  # paho's attribute names, in _NAMES' order
_PUBLISH = {
    ident: (attr, _PROPERTIES[ident][0], _PROTO.allowsMultiple(attr), _RANGES.get(attr))
    for attr, ident in zip(_ATTRIBUTES, _NAMES.values())
    if PacketTypes.PUBLISH in _PROPERTIES[ident][1]
}


class _NotPlain(Exception):
    """Not plainly well-formed: paho's own unpack decides."""


def _utf8(b: bytes, i: int, end: int) -> tuple[str, int]:
    """A UTF-8 string at b[i:] inside the block ending at end, checked as read_utf does."""
    if i + 2 > end:
        raise _NotPlain
    j = i + 2 + (b[i] << 8 | b[i + 1])
    if j > end:
        raise _NotPlain
    text = b[i + 2 : j].decode("utf-8")
    if "\x00" in text:
        raise _NotPlain
    return text, j


def _vbi(b: bytes, i: int, end: int) -> tuple[int, int]:
    """A Variable Byte Integer at b[i:] ending before end, decoded as paho does (any length):
    (value, the index after it)."""
    value, mult = 0, 1
    while i < end:
        digit = b[i]
        i += 1
        value += (digit & 127) * mult
        if digit < 128:
            return value, i
        mult *= 128
    raise _NotPlain


def _parse(b: bytes) -> tuple[dict, int]:
    """({attribute: value}, bytes used) of the property block at the start of b, or _NotPlain."""
    value, i = _vbi(b, 0, len(b))
    end = i + value
    if end > len(b):
        raise _NotPlain
    out: dict = {}
    while i < end:
        ident = b[i]
        i += 1
        spec = _PUBLISH.get(ident)  # identifiers >= 128 (two-byte VBIs) are none of MQTT's
        if spec is None:
            raise _NotPlain
        name, kind, repeatable, limits = spec
        if kind == _PAIR:
            key, i = _utf8(b, i, end)
            text, i = _utf8(b, i, end)
            v: Any = (key, text)
        elif kind == _UTF8:
            v, i = _utf8(b, i, end)
        elif kind == _BYTE:
            v = b[i] if i < end else None
            i += 1
        elif kind == _INT2:
            v = int.from_bytes(b[i : i + 2], "big")
            i += 2
        elif kind == _INT4:
            v = int.from_bytes(b[i : i + 4], "big")
            i += 4
        elif kind == _BINARY:
            j = i + 2 + (b[i] << 8 | b[i + 1]) if i + 2 <= end else end + 1
            v = b[i + 2 : j]
            i = j
        elif kind == _VBI:
            v, i = _vbi(b, i, end)
        else:
            raise _NotPlain
        if i > end:
            raise _NotPlain
        if limits is not None and not limits[0] <= v <= limits[1]:
            raise _NotPlain
        if repeatable:
            out.setdefault(name, []).append(v)
        elif name in out:
            raise _NotPlain
        else:
            out[name] = v
    return out, end


def publish_unpack(self, buffer):
    """Properties.unpack: a PUBLISH's property block in one pass; paho's own for
    anything else (other packet types, what is not plainly well-formed)."""
    if self.packetType != PacketTypes.PUBLISH or _props.readUTF is not read_utf or type(buffer) is not bytes:
        return PAHO_UNPACK(self, buffer)
    try:
        values, used = _parse(buffer)
    except (_NotPlain, IndexError, UnicodeDecodeError):
        return PAHO_UNPACK(self, buffer)
    d = self.__dict__
    for name in _ATTRIBUTES:  # paho's clear()
        d.pop(name, None)
    d.update(values)
    return self, used


def fast_init(self, packetType):
    """Properties.__init__ with paho's constant tables copied, not rebuilt. The lists of packet
    types in `properties` are shared by every instance: paho 2.1 only reads them (pack,
    __setattr__, __str__, json), and nothing here may change them."""
    d = self.__dict__
    d["packetType"] = packetType
    d["types"] = list(_TYPES)
    d["names"] = dict(_NAMES)
    d["properties"] = dict(_PROPERTIES)


# the paho-mqtt whose parser the differential test compares against (pyproject.toml pins it)
PAHO_VERSION = "2.1.0"


def install() -> None:
    """The U+FEFF fix; and the PUBLISH property parser if paho is the version it was tested
    against (another version keeps paho's own parser)."""
    _props.readUTF = read_utf  # looked up as a module global by Properties.readProperty
    if paho.mqtt.__version__ == PAHO_VERSION:
        _props.Properties.unpack = publish_unpack  # type: ignore[method-assign]
        _props.Properties.__init__ = fast_init  # type: ignore[method-assign]
