"""Fuzz the device's MQTT packet parsers and the client's receive path inside the
MicroPython Unix port (tests/mpy/fuzz_packet.py): a bounded run here; the long run is

    MICROPYPATH=firmware:tests/mpy .venv/bin/micropython tests/mpy/fuzz_packet.py 5000000 7
"""

from __future__ import annotations

import re

from mqbatch_testing import MPY_TESTS, run_mpy


def test_fuzz_packet_parsers_in_the_unix_port(capsys):
    n = 50_000
    proc = run_mpy(MPY_TESTS / "fuzz_packet.py", str(n), "1", timeout=300)
    m = re.search(
        r"FUZZ n=(\d+) crashes=(\d+) parser_ok=(\d+) parser_malformed=(\d+) client_mqtt_error=(\d+) "
        r"client_closed=(\d+)",
        proc.stdout,
    )
    assert proc.returncode == 0 and m, proc.stdout[-3000:] + proc.stderr[-3000:]
    total, crashes, ok, bad, err, closed = map(int, m.groups())
    assert (total, crashes) == (n, 0), proc.stdout[-3000:]
    assert ok + bad == n and err + closed == n and min(ok, bad, err, closed) > 500  # every outcome exercised
    with capsys.disabled():
        print("\n" + m.group(0))
