"""batch-hmac (host/mqbatch/wire/integrity.py; device: firmware/mqb_hmac.py).

The shared vectors (tests/vectors/batch_hmac_v1.json) are checked here against
the host code and in tests/mpy/mp_test_hmac.py against the device code; the last
test signs on a real virtual device and verifies what a real Mosquitto delivered.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from mqbatch.lab.devices import Fleet
from mqbatch.wire import codec
from mqbatch.wire import integrity as I
from mqbatch_testing import ROOT

VECTORS = json.loads((ROOT / "tests" / "vectors" / "batch_hmac_v1.json").read_text())["cases"]
KEY = bytes(range(32))
TOPIC = "mqbatch/dev-001/telemetry"


def _props(c):
    return [("batch-format", "v1"), ("batch-size", c["batch_size"]), (I.PROPERTY, c[I.PROPERTY])]


@pytest.mark.fast
@pytest.mark.parametrize("c", VECTORS, ids=[c["note"] for c in VECTORS])
def test_vectors_verify_and_sign_reproduces_them(c):
    key, payload = bytes.fromhex(c["key"]), bytes.fromhex(c["payload"])
    assert I.verify(key, c["topic"], _props(c), payload) is None
    assert I.sign(key, c["topic"], _props(c)[:2], payload) == (I.PROPERTY, c[I.PROPERTY])
    # the message layout, byte by byte (docs/format.md)
    t, n = c["topic"].encode(), c["batch_size"].encode()
    msg = (
        b"MQH1"
        + len(t).to_bytes(2, "big")
        + t
        + b"\x00\x02v1"
        + len(n).to_bytes(2, "big")
        + n
        + len(payload).to_bytes(4, "big")
        + payload
    )
    assert I.message(c["topic"], _props(c), payload) == msg and len(msg) == c["message_len"]
    assert hmac.new(key, msg, hashlib.sha256).hexdigest() == c[I.PROPERTY]


@pytest.mark.fast
def test_every_flipped_payload_bit_and_every_bound_field_fails():
    c = VECTORS[1]
    key, payload = bytes.fromhex(c["key"]), bytes.fromhex(c["payload"])
    props = _props(c)
    for i in range(len(payload) * 8):
        bad = bytearray(payload)
        bad[i // 8] ^= 1 << (i % 8)
        assert I.verify(key, c["topic"], props, bytes(bad)) == I.INVALID, i
    assert I.verify(key, "mqbatch/dev-002/telemetry", props, payload) == I.INVALID  # another device's topic
    assert I.verify(key, c["topic"], [("batch-format", "v1"), ("batch-size", "3"), props[2]], payload) == I.INVALID
    assert I.verify(key, c["topic"], [("batch-format", "v2"), props[1], props[2]], payload) == I.INVALID
    assert I.verify(bytes(reversed(key)), c["topic"], props, payload) == I.INVALID  # another key
    assert I.verify(key, c["topic"], props[:2], payload) == I.MISSING
    assert I.verify(key, c["topic"], props + [props[2]], payload) == I.MALFORMED  # twice
    assert I.verify(key, c["topic"], props[:2] + [(I.PROPERTY, c[I.PROPERTY].upper())], payload) == I.MALFORMED
    assert I.verify(key, c["topic"], props[:2] + [(I.PROPERTY, c[I.PROPERTY][:-2])], payload) == I.MALFORMED
    # bytes forms (as some MQTT libraries hand them over) verify the same
    bprops = [(k.encode(), v.encode()) for k, v in props]
    assert I.verify(key, c["topic"].encode(), bprops, bytearray(payload)) is None


def test_parse_key_says_what_is_wrong():
    assert I.parse_key("00" * 32) == bytes(32)
    for text, msg in (
        ("0" * 31, "not hex"),
        ("zz" * 16, "not hex"),
        ("00" * 15, "15 bytes"),
        ("00" * 65, "65 bytes"),
        (None, "hex string"),
    ):
        with pytest.raises(ValueError, match=msg):
            I.parse_key(text)
    with pytest.raises(ValueError, match="16..64"):
        I.sign(b"short", TOPIC, [], b"x")


def test_device_signs_every_batch_and_the_host_verifies_it(mosquitto, subscriber, pki, tmp_path):
    """A virtual device (the compiled firmware in the Unix port, 68 KB heap) with
    hmac_key publishes over TLS to a real Mosquitto; every batch a paho subscriber
    receives verifies under the key, and fails under another. (68K, not 64K: in 64K this
    signing device's start-up depends on where the heap's free runs fall, and config
    strings such as the CA file's path move them: it passed in one checkout and failed
    with a 592-byte MemoryError in App.__init__ in a fresh clone; docs/application.md.)"""
    creds = {"dev-001": "pw-1"}
    reader = ("reader", "reader-pw")
    broker = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={**creds, reader[0]: reader[1]},
        acl="user reader\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n",
    )
    sub = subscriber(broker, "mqbatch/+/telemetry", username=reader[0], password=reader[1])
    cfg = {
        "sample_hz": 20,
        "run_for_s": 3,
        "drain_timeout_s": 20,
        "health_every_s": 1,
        "hmac_key": KEY.hex(),
        "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 1000},
    }
    with Fleet(
        tmp_path / "fleet", broker.host, broker.port, credentials=creds, ca=pki.ca_cert, heapsize="68K", config=cfg
    ) as fleet:
        fleet.start()
        assert fleet.wait(90) == {"dev-001": 0}, fleet.console("dev-001")[-2000:]
        s = fleet.summaries()["dev-001"]
    msgs = sub.settle(quiet=1.0)
    assert msgs and s["acked_batches"] == len(msgs), (s, len(msgs))
    for m in msgs:
        assert codec.decode(m.user_properties, m.payload, topic=m.topic).status == codec.OK
        assert I.verify(KEY, m.topic, m.user_properties, m.payload) is None, m.user_properties
        assert I.verify(bytes(32), m.topic, m.user_properties, m.payload) == I.INVALID
    print(f"{len(msgs)} signed batches verified ({sum(len(m.payload) for m in msgs)} payload bytes)")
