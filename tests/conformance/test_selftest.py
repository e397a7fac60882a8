"""`mqbatch conformance self-test`: the harness against its own faulty publishers (the short set
here; `mqbatch conformance self-test --full` runs them all, docs/conformance.md). Every faulty
publisher must FAIL on its own row and nowhere a rule is not broken; the clean raw-socket
publisher must FAIL nowhere. A firmware mutation is applied to a temporary copy only."""

from __future__ import annotations

import hashlib

import pytest

from mqbatch.conformance import selftest
from mqbatch.util.paths import FIRMWARE


def _firmware_digest() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(FIRMWARE.glob("*.py")))).hexdigest()


@pytest.mark.fast
def test_short_self_test_kills_every_faulty_publisher(tmp_path, capsys):
    before = _firmware_digest()
    st = selftest.run(tmp_path, full=False, progress=lambda m: None)
    assert _firmware_digest() == before  # firmware/ untouched by the mutations
    survivors = {m["name"]: (m["why"], m["failed"], m["evidence"]) for m in st["mutants"] if not m["killed"]}
    assert not survivors, survivors
    assert st["faulty"] >= 6 and any(m["name"].startswith("fw-") for m in st["mutants"])
    assert st["clean_ok"], st["clean_failed"]
    with capsys.disabled():
        print(
            f"\nself-test (short): {st['killed']} of {st['faulty']} killed; clean publisher on "
            f"{len(st['clean_scenarios'])} scenarios: no FAIL; "
            + ", ".join(f"{m['name']} {m['seconds']} s" for m in st["mutants"])
        )


def test_a_faulty_publisher_that_breaks_nothing_survives(tmp_path):
    """The kill count can fail: the clean publisher posing as a Receive Maximum mutant survives."""
    m = selftest.Mutant("clean-as-mutant", "MQTT-RECEIVE-MAX", ["inflight-2"])
    st = selftest.run(tmp_path, mutants=[m], progress=lambda x: None)
    assert (st["faulty"], st["killed"]) == (1, 0) and "MQTT-RECEIVE-MAX did not FAIL" in st["mutants"][0]["why"]


@pytest.mark.fast
def test_every_firmware_mutation_still_applies():
    """Each firmware mutation names text found exactly once in today's firmware (a refactor that
    moves it makes this fail at once, not minutes into a self-test)."""
    stale = []
    for m in selftest.MUTANTS:
        edits = m.firmware or ()
        for mod, old in zip(edits[::3], edits[1::3]):
            n = (FIRMWARE / mod).read_text(encoding="utf-8").count(old) if (FIRMWARE / mod).exists() else 0
            if n != 1:
                stale.append((m.name, mod, old, n))
    assert not stale, stale
    assert any(m.firmware for m in selftest.MUTANTS)
