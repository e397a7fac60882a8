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

    MQBATCH_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/security/test_security_fuzz.py -q -s

The same handling without a broker, at the scale a broker cannot reach (paho's
PUBLISH handler -> the recorder's conversion -> WAL -> Arrow, well-formed and
mutated packets): tests/security/fuzz_recorder_props.py, bounded here, long run

    .venv/bin/python tests/security/fuzz_recorder_props.py --cases 10000000 --seed N

It found that paho-mqtt 2.1.0 refuses U+FEFF in a property (MQTT 5.0 requires
receivers to keep it) by raising in the recorder's network thread, which then
stopped landing anything (mqbatch.util.paho_compat; the end-to-end test below).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from test_security_e2e import device, send, stop_and_count

from mqbatch.ingest import landing
from mqbatch.scenarios.secmatrix import wait_until
from mqbatch.util.paths import ROOT


def fuzz_tool():
    spec = importlib.util.spec_from_file_location(
        "fuzz_recorder_props", ROOT / "tests" / "security" / "fuzz_recorder_props.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EXAMPLES = int(os.environ.get("MQBATCH_FUZZ_EXAMPLES", "40"))
# MQTT UTF-8 strings: Mosquitto refuses control characters (C0, C1) and noncharacters with
# a closed connection (checked below to stay rare: the fuzz must reach the recorder)
text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Cn")), max_size=40)
publishes = st.fixed_dictionaries(
    {
        "user": st.lists(st.tuples(text, text), max_size=300),
        "content_type": st.none() | text,
        "pfi": st.none() | st.sampled_from([0, 1]),
        "expiry": st.none() | st.integers(1, 2**32 - 1),
        "response_topic": st.none()
        | st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="+#"), min_size=1, max_size=30
        ),
        "correlation": st.none() | st.binary(max_size=64),
        "payload": st.binary(max_size=2000),
    }
)


def test_offline_fuzz_of_paho_and_the_recorder_conversion_finds_nothing():
    """A bounded run of tests/security/fuzz_recorder_props.py (the long run: 10 M cases, docs/security.md)."""
    s = fuzz_tool().run(20_000, seed=7)
    print(
        f"offline recorder fuzz: {s['cases']} cases, {s['mutated']} mutated, {s['refused_by_paho']} refused by paho, "
        f"{s['user_properties']} user properties landed"
    )
    assert s["failures"] == []
    assert s["cases"] == 20_000 and s["user_properties"] > 20_000  # the run exercised what it claims
    assert 0 < s["refused_by_paho"] < s["mutated"]  # mutations reach both outcomes


def test_the_fuzz_catches_pahos_u_feff_refusal():
    """Without mqbatch.util.paho_compat, well-formed packets carrying U+FEFF are refused: the fuzz must say so."""
    import paho.mqtt.properties as props

    from mqbatch.util import paho_compat

    tool = fuzz_tool()
    original = props.readUTF
    try:
        props.readUTF = paho_compat.PAHO_READ_UTF
        failures = tool.run(3_000, seed=7)["failures"]
    finally:
        props.readUTF = original
    assert failures and all("U+FEFF" in f for f in failures if "refused a well-formed" in f), failures[:3]


def test_the_recorders_property_parser_gives_what_pahos_gives():
    """mqbatch.util.paho_compat parses PUBLISH property blocks itself (paho's own cost about half of
    a subscriber's CPU): on well-formed, mutated and odd blocks (identifiers not allowed on a
    PUBLISH, repeated single properties, values out of paho's ranges, lengths past the block) the
    message, every Properties attribute, or the refusal (type and text) must be paho's own."""
    d = fuzz_tool().differential(4_000, seed=7)
    print(
        f"differential: {d['cases']} cases, {d['odd']} odd blocks, {d['refused']} refused by paho, "
        f"{d['fast_path']} parsed by the recorder's own path"
    )
    assert d["failures"] == []
    assert d["odd"] > 500 and d["fast_path"] > 1_000 and d["refused"] > 500  # every path was taken


@pytest.mark.parametrize(
    "ident, change",
    [
        (1, lambda spec: spec[:3] + (None,)),  # Payload Format Indicator 2 accepted: paho refuses it
        (35, lambda spec: spec[:3] + ((0, 65535),)),  # Topic Alias 0 accepted: paho refuses it
        (11, lambda spec: spec[:2] + (False,) + spec[3:]),  # Subscription Identifier kept once, not listed
    ],
    ids=["pfi-range", "topic-alias-0", "sub-id-single"],
)
def test_the_differential_catches_a_parser_that_differs_from_pahos(monkeypatch, ident, change):
    from mqbatch.util import paho_compat

    monkeypatch.setitem(paho_compat._PUBLISH, ident, change(paho_compat._PUBLISH[ident]))
    assert fuzz_tool().differential(2_000, seed=8)["failures"]


@pytest.mark.parametrize(
    "check, without",
    [
        ("        if i > end:\n            raise _NotPlain\n", ""),  # a value read past its block
        ("        elif name in out:\n            raise _NotPlain\n", ""),  # a single property twice
    ],
    ids=["past-the-block", "repeated-single"],
)
def test_the_differential_catches_a_parser_without_one_of_its_checks(monkeypatch, check, without):
    """Mutants of the parser's own code, each without one check: the differential must see it."""
    import inspect

    from mqbatch.util import paho_compat

    source = inspect.getsource(paho_compat._parse)
    assert source.count(check) == 1, "the check to remove is not (once) in _parse"
    namespace = dict(vars(paho_compat))
    exec(source.replace(check, without), namespace)  # noqa: S102 - a mutant of our own function
    monkeypatch.setattr(paho_compat, "_parse", namespace["_parse"])
    assert fuzz_tool().differential(2_000, seed=8)["failures"]


def test_the_parser_is_installed_for_the_tested_paho_only(monkeypatch):
    import paho.mqtt
    import paho.mqtt.properties as props

    from mqbatch.util import paho_compat

    assert paho.mqtt.__version__ == paho_compat.PAHO_VERSION
    assert props.Properties.unpack is paho_compat.publish_unpack
    monkeypatch.setattr(paho.mqtt, "__version__", "9.9.9")
    monkeypatch.setattr(props.Properties, "unpack", paho_compat.PAHO_UNPACK)
    monkeypatch.setattr(props.Properties, "__init__", paho_compat.PAHO_INIT)
    paho_compat.install()
    assert props.Properties.unpack is paho_compat.PAHO_UNPACK and props.readUTF is paho_compat.read_utf


@pytest.mark.broker
def test_a_u_feff_property_is_landed_and_the_recorder_goes_on(secure_stack, stack_recorder, tmp_path):
    """Mosquitto forwards a user property holding U+FEFF (valid MQTT); paho-mqtt 2.1.0 raised on it in
    the recorder's network thread, which stopped landing for every device (0 of the next 10 landed)."""
    stack = secure_stack(["dev-001", "dev-002"])
    rec = stack_recorder(stack, tmp_path / "landing")
    bad, other = device(stack, "dev-001"), device(stack, "dev-002")
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("note", "\ufeffzero width no-break space")]
    assert bad.publish("mqbatch/dev-001/telemetry", b"bom-0", properties=props).startswith("0x00")
    acked = [b"bom-0"] + send(other, "dev-002", 10, "after")
    assert stop_and_count(rec, tmp_path / "landing", acked, "U+FEFF property then another device") == len(acked)
    row = next(r for r in landing.read_landing(tmp_path / "landing").to_pylist() if r["payload"] == b"bom-0")
    assert [(u["key"], u["value"]) for u in row["user_properties"]] == props.UserProperty


@pytest.mark.broker
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
        for name, key in (
            ("ContentType", "content_type"),
            ("PayloadFormatIndicator", "pfi"),
            ("MessageExpiryInterval", "expiry"),
            ("ResponseTopic", "response_topic"),
            ("CorrelationData", "correlation"),
        ):
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
    print(
        f"fuzz: {state['n']} PUBLISHes, {len(expected)} acknowledged and checked, "
        f"{len(refused)} refused by the broker ({sorted(set(refused))})"
    )
    assert rec.status == 0, rec.out.getvalue()
    assert len(expected) >= state["n"] // 2, "the broker refused most examples: the fuzz tests nothing"
    for payload, p in expected.items():
        r = rows.get(payload)
        assert r is not None, f"acknowledged PUBLISH not landed: {p}"
        assert [(u["key"], u["value"]) for u in r["user_properties"]] == p["user"]
        assert r["content_type"] == p["content_type"]
        assert r["payload_format_indicator"] == p["pfi"]


@pytest.mark.broker
def test_recorder_stops_loudly_if_pahos_network_thread_dies(secure_stack, stack_recorder, tmp_path, monkeypatch):
    """Any other exception inside paho's PUBLISH handling ends its network thread; the recorder
    must then exit 1 saying so, not look alive while landing nothing."""
    import paho.mqtt.client as mqtt

    stack = secure_stack(["dev-001"])
    rec = stack_recorder(stack, tmp_path / "landing")
    real = mqtt.Client._handle_publish

    def poisoned(self):
        if b"poison" in self._in_packet["packet"]:
            raise RuntimeError("injected parser failure")
        return real(self)

    monkeypatch.setattr(mqtt.Client, "_handle_publish", poisoned)
    dev = device(stack, "dev-001")
    assert dev.publish("mqbatch/dev-001/telemetry", b"poison").startswith("0x00")
    wait_until(lambda: rec.recorder.error is not None, 10)
    assert rec.stop() == 1
    assert "network thread ended unexpectedly" in rec.out.getvalue()
