"""Issue 10, finding 4: fuzz the recorder's handling of PUBLISH properties through
a real broker. Hypothesis generates user properties (any count up to 300, any
assigned Unicode but surrogates and control characters, empty keys and values, duplicates), Content Type,
Payload Format Indicator (also 1 with a payload that is not UTF-8), Message Expiry,
Response Topic and Correlation Data; a device (paho-mqtt, its own account)
publishes each. Invariant: everything the broker acknowledged is landed exactly
(user properties in order, content type, format indicator, payload) and the
recorder keeps running. What the broker refuses (e.g. control characters it
deems malformed UTF-8) closes the device's connection without an acknowledgement:
nothing accepted, nothing lost; the device reconnects.

Bounded here (MQBATCH_FUZZ_EXAMPLES, default 40); long run:

    MQBATCH_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_security_fuzz.py -q -s
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqbatch import landing
from mqbatch.secmatrix import wait_until
from test_security_e2e import device

pytestmark = pytest.mark.broker

EXAMPLES = int(os.environ.get("MQBATCH_FUZZ_EXAMPLES", "40"))
# MQTT UTF-8 strings: Mosquitto refuses control characters (C0, C1) and noncharacters with
# a closed connection (checked below to stay rare: the fuzz must reach the recorder)
text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Cn")), max_size=40)
publishes = st.fixed_dictionaries({
    "user": st.lists(st.tuples(text, text), max_size=300),
    "content_type": st.none() | text,
    "pfi": st.none() | st.sampled_from([0, 1]),
    "expiry": st.none() | st.integers(1, 2 ** 32 - 1),
    "response_topic": st.none() | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E,
                                                        blacklist_characters="+#"), min_size=1, max_size=30),
    "correlation": st.none() | st.binary(max_size=64),
    "payload": st.binary(max_size=2000),
})


def test_recorder_lands_every_acknowledged_property_set_exactly(secure_stack, stack_recorder, tmp_path):
    stack = secure_stack(["dev-001"])
    rec = stack_recorder(stack, tmp_path / "landing")
    state = {"dev": device(stack, "dev-001"), "n": 0}
    expected: dict[bytes, dict] = {}
    refused = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(publishes)
    def one(p):
        props = Properties(PacketTypes.PUBLISH)
        if p["user"]:
            props.UserProperty = p["user"]
        for name, key in (("ContentType", "content_type"), ("PayloadFormatIndicator", "pfi"),
                          ("MessageExpiryInterval", "expiry"), ("ResponseTopic", "response_topic"),
                          ("CorrelationData", "correlation")):
            if p[key] is not None:
                setattr(props, name, p[key])
        state["n"] += 1
        payload = f"fuzz-{state['n']:06d}|".encode() + p["payload"]
        if not state["dev"].connected:
            state["dev"].close()
            state["dev"] = device(stack, "dev-001")
        rc = state["dev"].publish("mqbatch/dev-001/telemetry", payload, properties=props)
        if rc.startswith("0x00"):
            expected[payload] = p
        else:
            refused.append(rc)

    one()
    wait_until(lambda: rec.recorder.acked >= len(expected), 30)
    rec.stop()
    rows = {bytes(r["payload"]): r for r in landing.read_landing(tmp_path / "landing").to_pylist()}
    print(f"fuzz: {state['n']} PUBLISHes, {len(expected)} acknowledged and checked, "
          f"{len(refused)} refused by the broker ({sorted(set(refused))})")
    assert rec.status == 0, rec.out.getvalue()
    assert len(expected) >= state["n"] // 2, "the broker refused most examples: the fuzz tests nothing"
    for payload, p in expected.items():
        r = rows.get(payload)
        assert r is not None, f"acknowledged PUBLISH not landed: {p}"
        assert [(u["key"], u["value"]) for u in r["user_properties"]] == p["user"]
        assert r["content_type"] == p["content_type"]
        assert r["payload_format_indicator"] == p["pfi"]
